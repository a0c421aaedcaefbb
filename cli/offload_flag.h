// `--offload optimizer=device|host|nvme` and `--offload-dir DIR`: where the
// optimizer state lives (TrainSpec::offload, docs/offload.md), as the
// example trainers and the benchmarks spell it.
#ifndef ZEROSHARD_CLI_OFFLOAD_FLAG_H_
#define ZEROSHARD_CLI_OFFLOAD_FLAG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cli/flags.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::cli {

// Parses the value of `--offload`: comma-separated `state=tier` pairs; the
// one state for now is `optimizer` (the fp32 master and the Adam moments),
// the tiers `device`, `host` and `nvme`. Sets spec->optimizer and leaves the
// other fields. InvalidArgument naming the flag and the bad part.
absl::Status ParseOffloadFlag(absl::string_view flag, absl::string_view text, OffloadSpec* spec);

// Adds --offload (ParseOffloadFlag), --offload-dir DIR (spec->dir) and
// --offload-chunk N (spec->chunk_numel) to `flags`.
FlagSet& AddOffloadFlags(FlagSet& flags, OffloadSpec* spec);

// The usage lines of AddOffloadFlags' flags, for a --help text.
extern const char kOffloadFlagsUsage[];

// Checks the flags together after parsing: --offload-dir only with
// optimizer=nvme. (An nvme run without --offload-dir gets a scratch
// directory from the trainer: examples/common/scratch_dir.h.)
absl::Status CheckOffloadFlags(const OffloadSpec& spec);

}  // namespace zeroshard::cli

#endif  // ZEROSHARD_CLI_OFFLOAD_FLAG_H_
