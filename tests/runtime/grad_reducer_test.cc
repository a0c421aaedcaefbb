// GradReducer on its own (no engine): on 2 ranks and stages 0-2, with 1-3
// micro-batches, gradient views of units in a fresh random order per step,
// the reducer fires the final-gradient hook exactly once per unit and step,
// in the order the units' last micro-batches were reduced (its one queue
// retires in issue order, polling or blocking), and leaves in this rank's
// shard the sum over ranks and micro-batches, computed here by hand.
#include "engine/src/runtime/grad_reducer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/plan/buffer_plan.h"
#include "gtest/gtest.h"
#include "tests/runtime/runtime_test_services.h"
#include "tests/test_seed.h"

namespace zeroshard::testing {
namespace {

using internal::ElementRange;
using internal::FlatLayout;
using internal::GradReducer;
using internal::ShardBuffers;

// A small integer (exact in fp32 and in any order of sums) for one gradient
// element of one rank and micro-batch.
float GradValue(uint64_t seed, int rank, int64_t step, int micro, int unit, int64_t i) {
  uint64_t h = seed ^ 0x9e3779b97f4a7c15ull;
  for (uint64_t v :
       {static_cast<uint64_t>(rank), static_cast<uint64_t>(step), static_cast<uint64_t>(micro),
        static_cast<uint64_t>(unit), static_cast<uint64_t>(i)}) {
    h = (h ^ v) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  return static_cast<float>(static_cast<int>(h % 17) - 8);
}

struct Case {
  int stage;
  int accum;
  int grad_buffers;
};

absl::Status RunCase(const Case& c, int world) {
  const uint64_t seed =
      Seed() + static_cast<uint64_t>(c.stage * 100 + c.accum * 10 + c.grad_buffers);
  std::mt19937_64 model_rng(seed);
  const ModelSpec model = RandomModel(model_rng, 5);
  TrainSpec train;
  train.zero_stage = c.stage;
  train.grad_accum_steps = c.accum;
  train.num_grad_buffers = c.grad_buffers;
  return RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<RankRig> rig,
                        RankRig::Create(model, train, world, rank, comm));
    const FlatLayout& layout = rig->layout;
    ShardBuffers& buffers = *rig->buffers;
    GradReducer reducer(model, layout, rig->plan, rank, DType::kFloat32, c.accum, buffers,
                        *rig->services);
    std::vector<int> fired;
    reducer.set_final_grad_hook([&](int unit) {
      fired.push_back(unit);
      return absl::OkStatus();
    });
    const int units = layout.num_units();
    for (int64_t step = 0; step < 2; ++step) {
      // The same order on every rank (every rank issues the same collectives).
      std::vector<int> order(units);
      std::iota(order.begin(), order.end(), 0);
      std::mt19937_64 order_rng(seed + 7 * step);
      std::shuffle(order.begin(), order.end(), order_rng);
      fired.clear();
      for (int micro = 0; micro < c.accum; ++micro) {
        for (int u : order) {
          ZS_ASSIGN_OR_RETURN(std::vector<void*> views, reducer.OpenView(u));
          void* view = views.at(0);
          if (reducer.OpenView(u).status().code() != absl::StatusCode::kFailedPrecondition) {
            return absl::InternalError("a second OpenView before Reduce did not fail");
          }
          float* g = static_cast<float*>(view);
          for (const internal::ParamSlot& p : layout.unit(u).params) {
            for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
              g[i] = GradValue(seed, rank, step, micro, u, i);
            }
          }
          ZS_RETURN_IF_ERROR(reducer.Reduce(u));
          // A unit's hook never runs before its last micro-batch is reduced.
          if (micro < c.accum - 1 && !fired.empty()) {
            return absl::InternalError(
                absl::StrFormat("the hook fired for unit %d during micro-batch %d of %d",
                                fired.back(), micro, c.accum));
          }
        }
      }
      ZS_RETURN_IF_ERROR(reducer.Drain());
      ZS_RETURN_IF_ERROR(rig->services->SyncCompute());
      if (reducer.reductions_in_flight() != 0) return absl::InternalError("Drain left reductions");
      if (fired != order) {
        return absl::InternalError(absl::StrFormat(
            "step %d: the final-gradient hook fired for units [%s]; expected once per unit in "
            "issue order [%s]",
            step, absl::StrJoin(fired, ", "), absl::StrJoin(order, ", ")));
      }
      // This rank's shard holds the sum over ranks and micro-batches.
      for (int u = 0; u < units; ++u) {
        const ElementRange shard = layout.ShardRange(u, rank);
        const float* got = static_cast<const float*>(buffers.GradsAt(u, shard.begin));
        for (int64_t i = shard.begin; i < shard.end; ++i) {
          double want = 0.0;
          for (const internal::ParamSlot& p : layout.unit(u).params) {
            if (i < p.offset || i >= p.offset + p.numel) continue;
            for (int r = 0; r < world; ++r) {
              for (int m = 0; m < c.accum; ++m) want += GradValue(seed, r, step, m, u, i);
            }
          }
          if (static_cast<double>(got[i - shard.begin]) != want) {
            return absl::InternalError(
                absl::StrFormat("step %d unit %d element %d: reduced gradient %g, expected %g",
                                step, u, i, got[i - shard.begin], want));
          }
        }
      }
      for (int u = 0; u < units; ++u) {
        if (reducer.reduced_count(u) != c.accum) return absl::InternalError("reduced_count");
      }
      reducer.BeginNextStep();
    }
    const absl::Status no_view = reducer.Reduce(0);
    if (no_view.code() != absl::StatusCode::kFailedPrecondition) {
      return absl::InternalError("Reduce without a view did not fail");
    }
    return absl::OkStatus();
  });
}

TEST(GradReducerTest, RetiresInIssueOrderAndFiresTheHookOncePerUnit) {
  for (int world : {1, 2}) {
    for (int stage : {0, 1, 2}) {
      for (int accum : {1, 3}) {
        for (int buffers : {1, 2}) {
          const absl::Status s = RunCase({stage, accum, buffers}, world);
          EXPECT_TRUE(s.ok()) << "world " << world << " stage " << stage << " accum " << accum
                              << " grad buffers " << buffers << ": " << s << "; " << SeedTrace();
        }
      }
    }
  }
}

}  // namespace
}  // namespace zeroshard::testing
