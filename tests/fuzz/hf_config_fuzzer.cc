// libFuzzer target: bytes as a Hugging Face config.json through
// ParseHfConfig and ModelFromHfConfig (engine/src/plan/model_source.h).
// Besides "no crash, no sanitizer report, no hang, bounded memory" it checks
// the readers' contract: ModelFromHfConfig accepts nothing ParseHfConfig
// refuses, and an accepted config yields a model that passes
// ModelSpec::Validate, whose parameter count is representable and whose
// every unit has its tensor-parallel split dimensions.
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tests/fuzz/fuzz_check.h"
#include "zeroshard/estimate/model_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<zeroshard::TransformerShape> shape =
      zeroshard::ParseHfConfig(text, "config.json");
  const absl::StatusOr<zeroshard::ModelDescription> model =
      zeroshard::ModelFromHfConfig(text, "config.json");
  ZS_FUZZ_CHECK(shape.ok() || !model.ok(),
                "ModelFromHfConfig accepted a config that ParseHfConfig refuses");
  if (!model.ok()) return 0;
  ZS_FUZZ_CHECK(model->spec.Validate().ok(), "an accepted config gives an invalid ModelSpec");
  ZS_FUZZ_CHECK(model->spec.NumParams() > 0, "an accepted config has no parameters");
  bool any_split = false;
  for (const zeroshard::UnitSpec& unit : model->spec.units) {
    for (const zeroshard::ParamSpec& p : unit.params) any_split |= p.tp_split_dim >= 0;
  }
  ZS_FUZZ_CHECK(any_split, "a transformer's params carry no tensor-parallel split");
  return 0;
}
