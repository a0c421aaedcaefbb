// What the checkpoint tests share: a scratch directory per test, reading
// back the files a test wrote, and the example MLP trained on local ranks
// before a checkpoint call.
#ifndef ZEROSHARD_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define ZEROSHARD_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/runtime/engine_test_util.h"
#include "zeroshard/engine.h"

namespace zeroshard::testing {

// A fresh directory under /tmp for each test, removed after it.
class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  std::string Sub(const std::string& name) const;
  std::string dir_;
};

// The whole of a file the test wrote (NotFound when it cannot be opened).
absl::StatusOr<std::string> ReadTestFile(const std::string& path);
// The same, "" when it cannot be opened.
std::string ReadText(const std::string& path);
// A directory's entry names, sorted ({} when it cannot be listed).
std::vector<std::string> Entries(const std::string& dir);

// On run.world local ranks: an engine of cfg's MLP with MakeTrainSpec(run),
// loaded from `load` (or initialised when it is empty), started, trained
// `steps` steps; then body(rank, engine). Returns each rank's status of
// `body`; an error before it (or a rank that did not report) is the result.
absl::StatusOr<std::vector<absl::Status>> OnTrainedRanks(
    const mlp::MlpConfig& cfg, const RunConfig& run, const std::string& load, int steps,
    const std::function<absl::Status(int rank, Engine& engine)>& body);

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
