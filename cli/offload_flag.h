// `--offload optimizer=device|host|nvme[,grads=device|host][,params=device|host]`,
// `--offload-dir DIR` and `--offload-chunk N`: where the optimizer state, the
// gradient shard and stage 3's param shards live (TrainSpec::offload,
// docs/offload.md), as the example trainers spell it.
#ifndef ZEROSHARD_CLI_OFFLOAD_FLAG_H_
#define ZEROSHARD_CLI_OFFLOAD_FLAG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cli/flags.h"
#include "zeroshard/train_spec.h"

namespace zeroshard::cli {

// Parses the value of `--offload`: comma-separated `state=tier` pairs, each
// state at most once: `optimizer` (the fp32 master and the Adam moments) on
// `device`, `host` or `nvme`; `grads` and `params` on `device` or `host`.
// Sets the fields named and leaves the others (TrainSpec::Validate judges
// the combination). InvalidArgument naming the flag and the bad part, with
// *spec unchanged.
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
