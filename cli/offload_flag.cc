#include "cli/offload_flag.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "zeroshard/status.h"

namespace zeroshard::cli {

const char kOffloadFlagsUsage[] =
    "  --offload optimizer=T[,grads=T][,params=T]  where the optimizer state (fp32\n"
    "                     master, Adam moments) lives: device (default), host (the\n"
    "                     CPU AdamW) or nvme (swap files under --offload-dir); grads=host:\n"
    "                     a host copy of the gradient shard written during the backward;\n"
    "                     params=host|nvme: stage 3's param shards in host memory\n"
    "                     or in a swap file (nvme needs optimizer=nvme)\n"
    "                     (docs/offload.md)\n"
    "  --offload-dir DIR  the nvme tier's swap files (default: a fresh directory\n"
    "                     under /tmp, removed at the end)\n"
    "  --offload-chunk N  elements streamed per chunk, a multiple of 1024\n"
    "                     (default 1048576)\n";

absl::Status ParseOffloadFlag(absl::string_view flag, absl::string_view text, OffloadSpec* spec) {
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": empty; give state=tier pairs, e.g. optimizer=host or optimizer=nvme,params=host"));
  }
  // The states that move, and the tiers each may live on (nvme: the
  // optimizer state only; TrainSpec::Validate checks the combinations).
  struct State {
    const char* name;
    std::vector<std::string> tiers;
    MemoryTier OffloadSpec::*field;
  };
  const State states[] = {{"optimizer", {"device", "host", "nvme"}, &OffloadSpec::optimizer},
                          {"grads", {"device", "host"}, &OffloadSpec::grads},
                          {"params", {"device", "host", "nvme"}, &OffloadSpec::params}};
  OffloadSpec parsed = *spec;
  std::vector<std::string> seen;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    const std::vector<absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": '", part, "' is not state=tier (e.g. optimizer=host, optimizer=nvme)"));
    }
    const State* state = nullptr;
    for (const State& s : states) {
      if (kv[0] == s.name) state = &s;
    }
    if (state == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": '", kv[0], "' cannot be offloaded; the states are optimizer, grads and params"));
    }
    if (std::find(seen.begin(), seen.end(), state->name) != seen.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", state->name, " given twice in '", text, "'"));
    }
    seen.push_back(state->name);
    ZS_ASSIGN_OR_RETURN(int tier,
                        ParseChoiceFlag(absl::StrCat(flag, " ", state->name), kv[1], state->tiers));
    parsed.*(state->field) = static_cast<MemoryTier>(tier);  // the lists follow MemoryTier's order
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
