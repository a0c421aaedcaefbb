// ShardOptimizer on its own: its update runs against a per-element
// expectation from the params' groups (lr_scale, weight_decay, no_decay),
// the distinct groups it derives constants for, and its update of a whole
// shard against the double-precision Adam reference (kernels/reference),
// each param with its group's learning rate and decay, under AdamW and
// Adam with L2.
#include "engine/src/runtime/shard_optimizer.h"

#include <cmath>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "engine/src/plan/buffer_plan.h"
#include "gtest/gtest.h"
#include "kernels/reference/adam_reference.h"
#include "tests/runtime/runtime_test_services.h"
#include "tests/test_seed.h"

namespace zeroshard::testing {
namespace {

using internal::ElementRange;
using internal::FlatLayout;
using internal::ParamGroupSpec;
using internal::UpdateRun;

// RandomModel with param groups: each param's lr_scale and weight decay
// drawn from a few values (so that neighbours often share a group and
// merge), no_decay params keeping no weight_decay.
ModelSpec RandomGroupedModel(std::mt19937_64& rng, int units) {
  ModelSpec model = RandomModel(rng, units);
  const double scales[] = {1.0, 0.5, 0.0, 3.0};
  const double decays[] = {0.0, 0.02, 0.3};
  for (UnitSpec& unit : model.units) {
    for (ParamSpec& p : unit.params) {
      p.lr_scale = scales[rng() % 4];
      if (!p.no_decay && rng() % 2 == 0) p.weight_decay = decays[rng() % 3];
    }
  }
  return model;
}

TEST(ShardOptimizerTest, UpdateRunsCoverTheOwnedRangeWithEachParamsGroup) {
  std::mt19937_64 rng(Seed());
  int merged = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const ModelSpec model = RandomGroupedModel(rng, 1 + static_cast<int>(rng() % 6));
    const int world = 1 + static_cast<int>(rng() % 4);
    auto layout = FlatLayout::Create(model, world);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const int rank = static_cast<int>(rng() % world);
    const bool sharded = rng() % 2 == 0;
    auto owned = [&](int u) {
      return sharded ? layout->ShardRange(u, rank) : ElementRange{0, layout->unit(u).padded_numel};
    };
    const std::vector<UpdateRun> runs = internal::BuildUpdateRuns(*layout, model, owned);
    // Expected group per owned element: the param it belongs to decides;
    // an element of no param (gap, padding) may go either way.
    size_t k = 0;
    for (int u = 0; u < layout->num_units(); ++u) {
      const ElementRange range = owned(u);
      int64_t pos = range.begin;
      while (pos < range.end) {
        ASSERT_LT(k, runs.size()) << SeedTrace();
        const UpdateRun& run = runs[k];
        ASSERT_EQ(run.unit, u) << SeedTrace();
        ASSERT_EQ(run.range.begin, pos) << "runs must tile the owned range; " << SeedTrace();
        ASSERT_GT(run.range.end, run.range.begin) << SeedTrace();
        int params_in_run = 0;
        for (size_t p = 0; p < model.units[u].params.size(); ++p) {
          const internal::ParamSlot& slot = layout->unit(u).params[p];
          if (slot.offset >= run.range.end || slot.offset + slot.numel <= run.range.begin) continue;
          ++params_in_run;
          const ParamSpec& param = model.units[u].params[p];
          EXPECT_EQ(run.group.lr_scale, param.lr_scale)
              << "unit " << u << " param " << p << "; " << SeedTrace();
          // no_decay is a decay of 0; unset stays unset (the optimizer's).
          const std::optional<double> decay =
              param.no_decay ? std::optional<double>(0.0) : param.weight_decay;
          EXPECT_EQ(run.group.weight_decay, decay)
              << "unit " << u << " param " << p << "; " << SeedTrace();
        }
        merged += params_in_run > 1;
        // Neighbours of one unit differ in their group (merged otherwise).
        if (k > 0 && runs[k - 1].unit == u) {
          EXPECT_NE(runs[k - 1].group, run.group) << SeedTrace();
        }
        pos = run.range.end;
        ++k;
      }
    }
    EXPECT_EQ(k, runs.size()) << SeedTrace();
  }
  EXPECT_GT(merged, 0) << "no run ever held two params: merging untested; " << SeedTrace();
}

TEST(ShardOptimizerTest, ConstantsAreDerivedOncePerDistinctEffectiveGroup) {
  ModelSpec model;
  model.units.push_back({"a", {{"w", {5}, false}, {"b", {3}, true}, {"c", {4}, false}}});
  model.units.push_back({"b", {{"w", {6}, false}, {"n", {2}, false}}});
  model.units[0].params[2].weight_decay = 0.1;  // the optimizer's decay, given explicitly
  model.units[1].params[0].lr_scale = 0.5;
  model.units[1].params[1].weight_decay = 0.0;  // as no_decay
  auto layout = FlatLayout::Create(model, 1);
  ASSERT_TRUE(layout.ok());
  TrainSpec train;
  train.optimizer.weight_decay = 0.1;
  const internal::ShardOptimizer optimizer(train,
                                           internal::BuildUpdateRuns(*layout, model, [&](int u) {
                                             return ElementRange{0, layout->unit(u).padded_numel};
                                           }));
  // (1, 0.1) for a.w and a.c, (1, 0) for a.b and b.n, (0.5, 0.1) for b.w.
  ASSERT_EQ(optimizer.groups().size(), 3u);
  EXPECT_EQ(optimizer.groups()[0].lr_scale, 0.5);
  EXPECT_EQ(optimizer.groups()[0].weight_decay, 0.1);
  EXPECT_EQ(optimizer.groups()[1].lr_scale, 1.0);
  EXPECT_EQ(optimizer.groups()[1].weight_decay, 0.0);
  EXPECT_EQ(optimizer.groups()[2].lr_scale, 1.0);
  EXPECT_EQ(optimizer.groups()[2].weight_decay, 0.1);
}

TEST(ShardOptimizerTest, UpdateMatchesTheDoubleReferenceWithEachParamsGroup) {
  std::mt19937_64 rng(Seed() + 1);
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdamL2}) {
    SCOPED_TRACE(kind == OptimizerKind::kAdamW ? "AdamW" : "Adam L2");
    const ModelSpec model = RandomGroupedModel(rng, 4);
    TrainSpec train;
    train.zero_stage = 1;
    train.optimizer.kind = kind;
    train.optimizer.weight_decay = 0.1;
    auto group = CreateLocalGroup(1);
    ASSERT_TRUE(group.ok()) << group.status();
    auto services = TestServices::Create(*(*group)[0]);
    ASSERT_TRUE(services.ok()) << services.status();
    auto layout = FlatLayout::Create(model, 1);
    ASSERT_TRUE(layout.ok());
    auto plan = internal::PlanBuffers(*layout, train);
    ASSERT_TRUE(plan.ok()) << plan.status();
    internal::ShardBuffers buffers(*layout, *plan, 0, DType::kFloat32, DType::kFloat32);
    ASSERT_TRUE(buffers.Allocate((*services)->device()).ok());
    StreamDrain drain(**services);
    internal::ShardOptimizer optimizer(train, internal::BuildUpdateRuns(*layout, model, [&](int u) {
                                         return buffers.OwnedRange(u);
                                       }));
    std::set<std::pair<double, double>> groups;

    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<double> p, m, v;  // the reference's state, per param element
    auto params_of = [&](auto&& fn) {
      for (int u = 0; u < layout->num_units(); ++u) {
        for (size_t q = 0; q < model.units[u].params.size(); ++q) {
          const internal::ParamSlot& slot = layout->unit(u).params[q];
          fn(u, q, slot);
        }
      }
    };
    params_of([&](int u, size_t, const internal::ParamSlot& slot) {
      float* param = static_cast<float*>(buffers.ParamsAt(u, slot.offset));
      for (int64_t i = 0; i < slot.numel; ++i) {
        param[i] = dist(rng);
        p.push_back(param[i]);
        m.push_back(0.0);
        v.push_back(0.0);
      }
    });
    const double grad_scale = 0.5;
    for (int step = 1; step <= 3; ++step) {
      const double lr = 0.01 * step;
      std::vector<double> g;
      params_of([&](int u, size_t, const internal::ParamSlot& slot) {
        float* grad = static_cast<float*>(buffers.GradsAt(u, slot.offset));
        for (int64_t i = 0; i < slot.numel; ++i) {
          grad[i] = dist(rng);
          g.push_back(grad[i]);
        }
      });
      ASSERT_TRUE(optimizer.Apply(buffers, (*services)->ops(), grad_scale, lr).ok());
      ASSERT_TRUE((*services)->SyncCompute().ok());
      EXPECT_EQ(optimizer.applied_steps(), step);
      size_t at = 0;
      params_of([&](int u, size_t q, const internal::ParamSlot& slot) {
        const ParamSpec& spec = model.units[u].params[q];
        kernels::reference::AdamReferenceParams ref;
        ref.decoupled_weight_decay = kind == OptimizerKind::kAdamW;
        // torch's param groups: the group's rate is the schedule's times
        // its scale; its decay is its own, 0 for no_decay, else the
        // optimizer's.
        ref.lr = lr * spec.lr_scale;
        ref.weight_decay =
            spec.no_decay ? 0.0 : spec.weight_decay.value_or(train.optimizer.weight_decay);
        ref.grad_scale = grad_scale;
        ref.step = step;
        groups.insert({spec.lr_scale, ref.weight_decay});
        const size_t n = static_cast<size_t>(slot.numel);
        kernels::reference::AdamStepReference(ref, &p[at], &g[at], &m[at], &v[at], n);
        const float* param = static_cast<const float*>(buffers.ParamsAt(u, slot.offset));
        for (size_t i = 0; i < n; ++i) {
          ASSERT_NEAR(param[i], p[at + i], 1e-6 + 1e-5 * std::fabs(p[at + i]))
              << "step " << step << " unit " << u << " param " << q << " element " << i << "; "
              << SeedTrace();
          // The next step starts from the kernel's fp32 state, so that each
          // step is judged alone.
          p[at + i] = param[i];
          m[at + i] = buffers.AdamMAt(u, slot.offset)[i];
          v[at + i] = buffers.AdamVAt(u, slot.offset)[i];
        }
        at += n;
      });
    }
    // The model had several groups, and the optimizer derived each once.
    EXPECT_GE(groups.size(), 2u) << SeedTrace();
    EXPECT_EQ(optimizer.groups().size(), groups.size()) << SeedTrace();
  }
}

}  // namespace
}  // namespace zeroshard::testing
