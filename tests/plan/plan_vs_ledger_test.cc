// The point of the planner: for the example MLP at world sizes 1-4 and every
// stage (0-3) and precision (fp32, bf16, fp16) the engine runs, each rank's ledger holds exactly
// the plan's model-state bytes per category, and the measured peak is within 1% of the plan (it is
// equal: the engine allocates the plan's buffers and nothing else).
#include <cstdio>
#include <mutex>
#include <vector>

#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "tests/common/memory_breakdown_test_util.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/estimate/model_description.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

struct RankMemory {
  int64_t by_category[kNumMemoryCategories] = {};
  int64_t model_states = 0;
  int64_t peak_after_create = 0;
  int64_t peak_after_steps = 0;
};

// Creates an engine on every rank, then trains two steps; returns each
// rank's ledger.
absl::StatusOr<std::vector<RankMemory>> MeasureRanks(const mlp::MlpConfig& cfg,
                                                     const TrainSpec& train, int world) {
  std::vector<RankMemory> out(world);
  std::mutex mu;
  const ModelSpec spec = mlp::BuildModelSpec(cfg);
  ZS_RETURN_IF_ERROR(RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
    RankMemory m;
    const MemoryLedger& ledger = device->ledger();
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      m.by_category[c] = ledger.current(static_cast<MemoryCategory>(c));
    }
    m.model_states = ledger.current_model_states();
    m.peak_after_create = ledger.peak_total();
    ZS_RETURN_IF_ERROR(mlp::InitEngineParams(*engine, cfg));
    ZS_RETURN_IF_ERROR(engine->Start());
    mlp::MlpTrainer trainer(cfg, *engine, comm);
    for (int step = 0; step < 2; ++step) ZS_RETURN_IF_ERROR(trainer.TrainStep().status());
    m.peak_after_steps = ledger.peak_total();
    std::lock_guard<std::mutex> lock(mu);
    out[rank] = m;
    return absl::OkStatus();
  }));
  return out;
}

TEST(PlanVsLedgerTest, LedgerEqualsPlanOnEveryRankForEveryEngineStage) {
  mlp::MlpConfig cfg;
  cfg.hidden = 48;
  cfg.blocks = 3;
  cfg.micro_batch = 4;
  ModelDescription model;
  model.name = "example-mlp";
  model.spec = mlp::BuildModelSpec(cfg);
  // A CPU rank: no CUDA context or kernel workspace, and the trainer keeps
  // its activations outside the engine.
  ClusterSpec cluster;
  cluster.reserve_bytes = 0;
  cluster.workspace_bytes = 0;
  cluster.gpu_mem_bytes = int64_t{1} << 30;
  int checked = 0;
  for (int world = 1; world <= 4; ++world) {
    cluster.gpus = world;
    cluster.gpus_per_node = world;
    for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed}) {
      for (int stage = 0; stage <= 3; ++stage) {
        for (int accum : {1, 2}) {
          PlanOptions options;
          options.precision = precision;
          options.stage = stage;
          options.offload = Offload::kNone;
          options.tp = options.pp = 1;
          options.grad_accum_steps = accum;
          auto plan = Planner::Plan(model, cluster, options);
          ASSERT_TRUE(plan.ok()) << plan.status();
          ASSERT_EQ(plan->candidates.size(), 1u);
          const Candidate& c = plan->candidates[0];
          ASSERT_TRUE(c.engine_supported);
          // The engine gets the TrainSpec a trainer would write by hand.
          TrainSpec train;
          train.zero_stage = stage;
          train.precision = precision;
          train.grad_accum_steps = accum;
          auto ranks = MeasureRanks(cfg, train, world);
          ASSERT_TRUE(ranks.ok()) << ranks.status();
          const std::string where = std::string("world ") + std::to_string(world) + " " +
                                    PrecisionName(precision) + " stage " + std::to_string(stage) +
                                    " accum " + std::to_string(accum);
          for (int r = 0; r < world; ++r) {
            const RankMemory& m = (*ranks)[r];
            for (int cat = 0; cat < kNumMemoryCategories; ++cat) {
              EXPECT_EQ(m.by_category[cat],
                        testing::PlannedBytes(c.per_gpu, static_cast<MemoryCategory>(cat)))
                  << where << " rank " << r << " "
                  << MemoryCategoryName(static_cast<MemoryCategory>(cat));
            }
            EXPECT_EQ(m.model_states, c.per_gpu.model_states()) << where << " rank " << r;
            const double planned = static_cast<double>(c.per_gpu.total());
            EXPECT_LE(std::abs(m.peak_after_create - planned), 0.01 * planned) << where;
            EXPECT_LE(std::abs(m.peak_after_steps - planned), 0.01 * planned) << where;
          }
          const RankMemory& m0 = (*ranks)[0];
          std::printf(
              "%-28s plan: model states %8lld, total %8lld bytes | ledger rank 0: model states "
              "%8lld, peak %8lld (%+.3f%%)\n",
              where.c_str(), static_cast<long long>(c.per_gpu.model_states()),
              static_cast<long long>(c.per_gpu.total()), static_cast<long long>(m0.model_states),
              static_cast<long long>(m0.peak_after_steps),
              100.0 * (static_cast<double>(m0.peak_after_steps) - c.per_gpu.total()) /
                  c.per_gpu.total());
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * 3 * 4 * 2);
}

}  // namespace
}  // namespace zeroshard
