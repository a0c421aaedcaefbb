// libFuzzer target: bytes as a checkpoint's `latest` file through ParseLatest
// and ParseStepDirName (engine/src/checkpoint/format.h), what
// ResolveCheckpoint runs on the (at most 256) bytes it reads. Besides "no
// crash, no sanitizer report, no hang" it checks the contract:
//  - an accepted text names a step directory: the name parses back to a
//    step, has no whitespace and is the text with surrounding whitespace
//    stripped;
//  - a refused text gives a message of bounded length with no control or
//    non-ASCII byte in it, whatever the text held (it is quoted, short).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "engine/src/checkpoint/format.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace zi = zeroshard::internal;
  if (size > static_cast<size_t>(zi::kMaxLatestBytes)) return 0;  // refused before parsing
  const std::string text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<std::string> name = zi::ParseLatest(text, "ckpt/latest");
  if (name.ok()) {
    const int64_t step = zi::ParseStepDirName(*name);
    ZS_FUZZ_CHECK(step >= 0, "an accepted `latest` names no step");
    ZS_FUZZ_CHECK(*name == absl::StripAsciiWhitespace(text),
                  "the name is not the text without surrounding whitespace");
    for (const char c : *name) {
      ZS_FUZZ_CHECK(!absl::ascii_isspace(static_cast<unsigned char>(c)),
                    "an accepted name holds whitespace");
    }
    // The canonical name of the same step parses to it too.
    ZS_FUZZ_CHECK(zi::ParseStepDirName(zi::StepDirName(step)) == step,
                  "StepDirName and ParseStepDirName disagree");
    return 0;
  }
  const std::string message(name.status().message());
  ZS_FUZZ_CHECK(message.size() < 512, "a refusal's message is not short");
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    ZS_FUZZ_CHECK(byte >= 0x20 && byte < 0x7f, "a refusal's message holds an unprintable byte");
  }
  return 0;
}
