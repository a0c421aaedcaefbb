// ShardOptimizer on its own: its decay runs against a per-element
// expectation from the params' no_decay flags, and its update of a whole
// shard against the double-precision Adam reference (kernels/reference),
// each param with or without weight decay as its spec says.
#include "engine/src/runtime/shard_optimizer.h"

#include <cmath>
#include <random>
#include <vector>

#include "engine/src/plan/buffer_plan.h"
#include "gtest/gtest.h"
#include "kernels/reference/adam_reference.h"
#include "tests/runtime/runtime_test_services.h"
#include "tests/test_seed.h"

namespace zeroshard::testing {
namespace {

using internal::DecayRun;
using internal::ElementRange;
using internal::FlatLayout;

TEST(ShardOptimizerTest, DecayRunsCoverTheOwnedRangeWithEachParamsSetting) {
  std::mt19937_64 rng(Seed());
  for (int trial = 0; trial < 40; ++trial) {
    const ModelSpec model = RandomModel(rng, 1 + static_cast<int>(rng() % 6));
    const int world = 1 + static_cast<int>(rng() % 4);
    auto layout = FlatLayout::Create(model, world);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const int rank = static_cast<int>(rng() % world);
    const bool sharded = rng() % 2 == 0;
    auto owned = [&](int u) {
      return sharded ? layout->ShardRange(u, rank) : ElementRange{0, layout->unit(u).padded_numel};
    };
    const std::vector<DecayRun> runs = internal::BuildDecayRuns(*layout, model, owned);
    // Expected setting per owned element: the param it belongs to decides;
    // an element of no param (gap, padding) may go either way.
    size_t k = 0;
    for (int u = 0; u < layout->num_units(); ++u) {
      const ElementRange range = owned(u);
      int64_t pos = range.begin;
      while (pos < range.end) {
        ASSERT_LT(k, runs.size()) << SeedTrace();
        const DecayRun& run = runs[k];
        ASSERT_EQ(run.unit, u) << SeedTrace();
        ASSERT_EQ(run.range.begin, pos) << "runs must tile the owned range; " << SeedTrace();
        ASSERT_GT(run.range.end, run.range.begin) << SeedTrace();
        for (int64_t i = run.range.begin; i < run.range.end; ++i) {
          for (size_t p = 0; p < model.units[u].params.size(); ++p) {
            const internal::ParamSlot& slot = layout->unit(u).params[p];
            if (i >= slot.offset && i < slot.offset + slot.numel) {
              ASSERT_EQ(run.decay, !model.units[u].params[p].no_decay)
                  << "unit " << u << " element " << i << "; " << SeedTrace();
            }
          }
        }
        // Neighbours of one unit differ in their setting (merged otherwise).
        if (k > 0 && runs[k - 1].unit == u) {
          EXPECT_NE(runs[k - 1].decay, run.decay) << SeedTrace();
        }
        pos = run.range.end;
        ++k;
      }
    }
    EXPECT_EQ(k, runs.size()) << SeedTrace();
  }
}

TEST(ShardOptimizerTest, UpdateMatchesTheDoubleReference) {
  std::mt19937_64 rng(Seed() + 1);
  const ModelSpec model = RandomModel(rng, 4);
  TrainSpec train;
  train.zero_stage = 1;
  train.optimizer.kind = OptimizerKind::kAdamW;
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
  internal::ShardOptimizer optimizer(train, internal::BuildDecayRuns(*layout, model, [&](int u) {
                                       return buffers.OwnedRange(u);
                                     }));

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
      kernels::reference::AdamReferenceParams ref;
      ref.decoupled_weight_decay = true;
      ref.lr = lr;
      ref.weight_decay = model.units[u].params[q].no_decay ? 0.0 : train.optimizer.weight_decay;
      ref.grad_scale = grad_scale;
      ref.step = step;
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
}

}  // namespace
}  // namespace zeroshard::testing
