// Overlap of the engine's communication with the trainer: the updated
// params' all-gathers are waited for lazily (at the next Gather, GetParam or
// Save, not in Step), and a one-rank engine issues no collective that would
// move nothing.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/runtime/synthetic_trainer.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

// Units large enough that an all-gather is still in flight when the trainer
// gathers right after Step (so a missing wait shows).
ModelSpec LargerSpec() {
  ModelSpec spec;
  for (int u = 0; u < 4; ++u) {
    spec.units.push_back(
        {absl::StrFormat("block.%d", u), {{"w", {384, 256}, false}, {"b", {256}, true}}});
  }
  return spec;
}

// Right after Step, every rank gathers every unit (last one first: its
// all-gather was issued last) and copies what it sees; GetParam (which waits
// for every all-gather) must then return the same bits, and they must differ
// from the weights before the step (the update happened).
TEST(DeferredParamGatherTest, AGatherRightAfterStepSeesTheUpdatedParams) {
  const ModelSpec spec = LargerSpec();
  for (int stage = 1; stage <= 2; ++stage) {
    for (int world : {2, 4}) {
      SCOPED_TRACE(absl::StrFormat("stage %d, world %d", stage, world));
      const absl::Status status = RunLocalRanks(world, [&](int rank, Communicator& comm) {
        auto device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(
            auto engine,
            Engine::Create(spec, SyntheticTrain(stage, Precision::kFp32), *device, comm));
        ZS_RETURN_IF_ERROR(SyntheticStart(*engine, spec));
        for (int step = 0; step < 3; ++step) {
          ZS_ASSIGN_OR_RETURN(auto before, AllParams(*engine, spec));
          ZS_RETURN_IF_ERROR(SyntheticStep(*engine, spec).status());
          std::vector<std::vector<float>> seen(spec.units.size() * 2);
          for (int u = static_cast<int>(spec.units.size()) - 1; u >= 0; --u) {
            ZS_ASSIGN_OR_RETURN(const UnitView view, engine->Gather(u));
            for (size_t p = 0; p < view.params.size(); ++p) {
              const float* data = static_cast<const float*>(view.params[p].data);
              seen[2 * u + p].assign(data, data + view.params[p].numel);
            }
            ZS_RETURN_IF_ERROR(engine->Release(u));
          }
          ZS_ASSIGN_OR_RETURN(auto after, AllParams(*engine, spec));
          for (size_t i = 0; i < after.size(); ++i) {
            if (std::memcmp(seen[i].data(), after[i].data(), after[i].size() * sizeof(float)) !=
                0) {
              return absl::InternalError(absl::StrFormat(
                  "rank %d step %d: param %d gathered right after Step differs from GetParam "
                  "(stale params: the all-gather was not waited for)",
                  rank, step + 1, i));
            }
            if (after[i] == before[i]) {
              return absl::InternalError(
                  absl::StrFormat("rank %d step %d: param %d did not change", rank, step + 1, i));
            }
          }
        }
        return absl::OkStatus();
      });
      EXPECT_TRUE(status.ok()) << status;
    }
  }
}

// One rank: the gradient all-reduce / reduce-scatter and the param
// all-gather read and write the same memory, so the engine issues none of
// them (only stage 2's reduce-scatter, which copies the staged gradient into
// the shard, remains); the weights are those of the same run on any world
// size (engine_test holds the bits).
TEST(OneRankTest, IssuesNoCollectiveThatMovesNothing) {
  const ModelSpec spec = LargerSpec();
  for (int stage = 0; stage <= 1; ++stage) {
    SCOPED_TRACE(absl::StrFormat("stage %d", stage));
    const absl::Status status = RunLocalRanks(1, [&](int, Communicator& comm) {
      auto device = CreateCpuDevice();
      ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, SyntheticTrain(stage, Precision::kFp32),
                                                      *device, comm));
      ZS_RETURN_IF_ERROR(SyntheticStart(*engine, spec));
      const int64_t at_start = engine->Stats().collectives;
      for (int step = 0; step < 3; ++step)
        ZS_RETURN_IF_ERROR(SyntheticStep(*engine, spec).status());
      const int64_t issued = engine->Stats().collectives - at_start;
      if (issued != 0) {
        return absl::InternalError(absl::StrFormat("%d collectives issued in 3 steps", issued));
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
  }
}

}  // namespace
}  // namespace zeroshard::testing
