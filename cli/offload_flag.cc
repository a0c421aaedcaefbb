#include "cli/offload_flag.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "zeroshard/status.h"

namespace zeroshard::cli {

const char kOffloadFlagsUsage[] =
    "  --offload optimizer=T  where the optimizer state (fp32 master, Adam moments)\n"
    "                     lives: device (default), host (host memory, the CPU AdamW)\n"
    "                     or nvme (swap files under --offload-dir) (docs/offload.md)\n"
    "  --offload-dir DIR  the nvme tier's swap files (default: a fresh directory\n"
    "                     under /tmp, removed at the end)\n"
    "  --offload-chunk N  elements streamed per chunk, a multiple of 1024\n"
    "                     (default 1048576)\n";

absl::Status ParseOffloadFlag(absl::string_view flag, absl::string_view text, OffloadSpec* spec) {
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": empty; give optimizer=device, optimizer=host or optimizer=nvme"));
  }
  OffloadSpec parsed = *spec;
  bool seen_optimizer = false;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    const std::vector<absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": '", part, "' is not state=tier (e.g. optimizer=host, optimizer=nvme)"));
    }
    if (kv[0] != "optimizer") {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", kv[0],
                       "' cannot be offloaded; the state that moves between tiers is optimizer"));
    }
    if (seen_optimizer) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": optimizer given twice in '", text, "'"));
    }
    seen_optimizer = true;
    ZS_ASSIGN_OR_RETURN(int tier, ParseChoiceFlag(absl::StrCat(flag, " optimizer"), kv[1],
                                                  {"device", "host", "nvme"}));
    parsed.optimizer = tier == 0   ? MemoryTier::kDevice
                       : tier == 1 ? MemoryTier::kHost
                                   : MemoryTier::kNvme;
  }
  *spec = parsed;
  return absl::OkStatus();
}

FlagSet& AddOffloadFlags(FlagSet& flags, OffloadSpec* spec) {
  return flags
      .Custom("offload",
              [spec](const std::string& v) { return ParseOffloadFlag("--offload", v, spec); })
      .String("offload-dir", &spec->dir)
      .Int("offload-chunk", &spec->chunk_numel, 1024, int64_t{1} << 30);
}

absl::Status CheckOffloadFlags(const OffloadSpec& spec) {
  if (!spec.dir.empty() && spec.optimizer != MemoryTier::kNvme) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--offload-dir is the nvme tier's directory; give --offload optimizer=nvme with it (the "
        "optimizer state is on the ",
        MemoryTierName(spec.optimizer), " tier)"));
  }
  if (spec.chunk_numel % 1024 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--offload-chunk ", spec.chunk_numel,
                     " must be a multiple of 1024 (4 KiB of fp32, the direct-I/O alignment)"));
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::cli
