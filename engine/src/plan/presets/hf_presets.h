// Built-in models, stored as the Hugging Face config.json fields that decide
// their shape (copied from the published configs), so a preset goes through
// the same parser as a user's config.json.
#ifndef ZEROSHARD_PLAN_PRESETS_HF_PRESETS_H_
#define ZEROSHARD_PLAN_PRESETS_HF_PRESETS_H_

#include <vector>

namespace zeroshard::internal {

struct HfPreset {
  const char* name;         // e.g. "llama-2-7b"
  const char* config_json;  // config.json subset
  const char* origin;       // where the numbers come from
};

// Every preset, in a stable order.
const std::vector<HfPreset>& HfPresets();

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_PLAN_PRESETS_HF_PRESETS_H_
