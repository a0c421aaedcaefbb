// libFuzzer target: bytes as a JSON model spec through ModelFromSpecJson
// (engine/src/plan/model_source.h). Besides "no crash, no sanitizer report,
// no hang, bounded memory" it checks the reader's contract: an accepted spec
// passes ModelSpec::Validate, has an activation size per unit, and a
// representable parameter count.
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tests/fuzz/fuzz_check.h"
#include "zeroshard/estimate/model_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<zeroshard::ModelDescription> model =
      zeroshard::ModelFromSpecJson(text, "spec.json");
  if (!model.ok()) return 0;
  ZS_FUZZ_CHECK(model->spec.Validate().ok(), "an accepted spec fails ModelSpec::Validate");
  ZS_FUZZ_CHECK(model->activation_bytes_per_sample.size() == model->spec.units.size(),
                "activation bytes not given for every unit");
  ZS_FUZZ_CHECK(model->spec.NumParams() > 0, "an accepted spec has no parameters");
  return 0;
}
