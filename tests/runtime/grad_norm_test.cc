// GradNorm on its own (no engine): on 1-3 ranks with gradients sharded,
// each rank's exact sum of squares over its shard equals a long double sum
// taken here, whatever order the units' gradients become final in; the
// ranks' sums add up to the whole gradient's; with model parallelism and
// count_replicated false the replicated params are left out but their
// non-finite values still count; a unit whose gradient never became final
// is an error, not a smaller norm.
#include "engine/src/runtime/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/plan/buffer_plan.h"
#include "gtest/gtest.h"
#include "tests/runtime/runtime_test_services.h"
#include "tests/test_seed.h"

namespace zeroshard::testing {
namespace {

using internal::ElementRange;
using internal::FlatLayout;
using internal::GradNorm;
using internal::ShardBuffers;

float GradValue(uint64_t seed, int unit, int64_t i) {
  std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(unit) << 40) ^ static_cast<uint64_t>(i));
  return std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
}

// `replicated_out`: model parallelism with count_replicated false, params
// with an odd index replicated. `nan_in_replicated`: one replicated
// element of unit 0 is NaN. `skip_unit`: a unit whose hook never runs (-1).
absl::Status RunCase(int world, bool replicated_out, bool nan_in_replicated, int skip_unit,
                     long double* total_out) {
  const uint64_t seed = Seed() + static_cast<uint64_t>(world);
  std::mt19937_64 rng(seed);
  ModelSpec model = RandomModel(rng, 4);
  for (UnitSpec& unit : model.units) {
    for (size_t p = 0; p < unit.params.size(); ++p) unit.params[p].tp_split_dim = p % 2 ? -1 : 0;
  }
  if (nan_in_replicated && model.units[0].params.size() < 2) {
    ParamSpec replicated;
    replicated.name = "replicated";
    replicated.shape = {5};
    replicated.tp_split_dim = -1;
    model.units[0].params.push_back(replicated);
  }
  TrainSpec train;
  train.zero_stage = 2;
  std::vector<long double> local(world, 0.0L);
  auto mp_group = CreateLocalGroup(1);  // this rank's model-parallel group: itself
  if (!mp_group.ok()) return mp_group.status();
  const absl::Status run = RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<RankRig> rig,
                        RankRig::Create(model, train, world, rank, comm));
    const FlatLayout& layout = rig->layout;
    ShardBuffers& buffers = *rig->buffers;
    GradNorm norm(layout, rank, DType::kFloat32, /*host_accessible=*/true, buffers, *rig->services);
    if (replicated_out) {
      ModelParallelOptions options;
      options.group = (*mp_group)[0].get();  // world 1 only
      options.count_replicated = false;
      norm.SetModelParallel(model, options);
    }
    // This rank's shard of every unit: the values of the param elements,
    // zero in gaps and padding, as a reduced gradient leaves it.
    long double want = 0.0L;
    for (int u = 0; u < layout.num_units(); ++u) {
      const ElementRange shard = layout.ShardRange(u, rank);
      float* g = static_cast<float*>(buffers.GradsAt(u, shard.begin));
      for (int64_t i = shard.begin; i < shard.end; ++i) {
        float v = 0.0f;
        bool counted = true;
        for (size_t p = 0; p < layout.unit(u).params.size(); ++p) {
          const internal::ParamSlot& slot = layout.unit(u).params[p];
          if (i < slot.offset || i >= slot.offset + slot.numel) continue;
          v = GradValue(seed, u, i);
          counted = !replicated_out || model.units[u].params[p].tp_split_dim >= 0;
          if (nan_in_replicated && u == 0 && !counted && i == slot.offset) {
            v = std::numeric_limits<float>::quiet_NaN();
          }
        }
        g[i - shard.begin] = v;
        if (counted) want += static_cast<long double>(v) * v;
      }
    }
    std::vector<int> order(layout.num_units());
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 order_rng(seed + 1 + static_cast<uint64_t>(rank));
    std::shuffle(order.begin(), order.end(), order_rng);
    for (int u : order) {
      if (u != skip_unit) ZS_RETURN_IF_ERROR(norm.OnGradFinal(u));
    }
    ZS_ASSIGN_OR_RETURN(kernels::ExactSum sum, norm.LocalSum());
    ZS_RETURN_IF_ERROR(norm.AddModelParallel(sum));
    if (nan_in_replicated) {
      if (sum.non_finite() == 0 || std::isfinite(sum.Value())) {
        return absl::InternalError("a NaN in a replicated param did not make the norm non-finite");
      }
      return absl::OkStatus();
    }
    const long double got = sum.Value();
    if (std::fabs(got - want) > 1e-12L * want) {
      return absl::InternalError(absl::StrFormat("rank %d: sum of squares %.17g, expected %.17Lg",
                                                 rank, static_cast<double>(got), want));
    }
    local[rank] = want;
    return absl::OkStatus();
  });
  *total_out = std::accumulate(local.begin(), local.end(), 0.0L);
  return run;
}

TEST(GradNormTest, ExactSumOverTheShardInAnyOrder) {
  long double whole = 0.0L;
  for (int world : {1, 2, 3}) {
    long double total = 0.0L;
    const absl::Status s = RunCase(world, false, false, -1, &total);
    ASSERT_TRUE(s.ok()) << "world " << world << ": " << s << "; " << SeedTrace();
    if (world == 1) whole = total;
  }
  EXPECT_GT(whole, 0.0L);
}

TEST(GradNormTest, ReplicatedParamsLeftOutButTheirNaNsCount) {
  long double total = 0.0L;
  absl::Status s = RunCase(1, true, false, -1, &total);
  EXPECT_TRUE(s.ok()) << s << "; " << SeedTrace();
  s = RunCase(1, true, true, -1, &total);
  EXPECT_TRUE(s.ok()) << s << "; " << SeedTrace();
}

TEST(GradNormTest, AUnitWhoseGradientNeverBecameFinalIsAnError) {
  long double total = 0.0L;
  const absl::Status s = RunCase(2, false, false, 2, &total);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("3 of 4 segments' gradients were final"), absl::string_view::npos)
      << s;
}

}  // namespace
}  // namespace zeroshard::testing
