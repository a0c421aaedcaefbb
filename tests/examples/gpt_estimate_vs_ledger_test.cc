// Issue 20's estimator acceptance at small shapes: the GPT example trained on
// 2 local ranks at three configurations (sequence length, recomputation,
// ZeRO stage, precision), each rank's ledger against `zeroshard estimate
// --config <its config.json> --activations gpt-example` for the same run
// (Planner::Plan on ModelFromHfConfig of the very config.json the trainer
// parsed): model states, communication buffers, activations, workspace and
// the measured peak of their sum all equal to the byte (the acceptance asks
// activations within 10%; the estimate counts the trainer's own tensors, so
// it is exact), with the ratios printed.
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_trainer.h"
#include "examples/gpt/text_data.h"
#include "gtest/gtest.h"
#include "tests/common/memory_breakdown_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace gpt {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

struct Config {
  int stage = 1;
  bool recompute = false;
  Precision precision = Precision::kFp32;
  int accum = 1;
  int64_t seq = 32;
  int64_t micro_batch = 2;
};

std::string Describe(const Config& c) {
  return absl::StrFormat("stage %d, seq %d, micro-batch %d, recompute %s, %s, accum %d", c.stage,
                         c.seq, c.micro_batch, c.recompute ? "full" : "none",
                         PrecisionName(c.precision), c.accum);
}

// Per rank: the ledger's current bytes per category after two steps, and its
// peaks.
struct Measured {
  int64_t current[kNumMemoryCategories] = {};
  int64_t peak[kNumMemoryCategories] = {};
  int64_t peak_total = 0;
};

constexpr int kRanks = 2;

std::vector<uint8_t> RandomText(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> t(n);
  for (uint8_t& b : t) b = static_cast<uint8_t>(rng());
  return t;
}

TrainSpec Train(const Config& c) {
  TrainSpec t;
  t.zero_stage = c.stage;
  t.precision = c.precision;
  t.optimizer.weight_decay = 0.1;
  t.max_grad_norm = 1.0;
  t.grad_accum_steps = c.accum;
  return t;
}

absl::StatusOr<std::vector<Measured>> Measure(const GptConfig& cfg, const Config& c,
                                              const std::vector<uint8_t>& text, uint64_t seed) {
  std::vector<Measured> out(kRanks);
  std::mutex mu;
  ZS_RETURN_IF_ERROR(RunLocalRanks(kRanks, [&](int rank, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(BuildGptModelSpec(cfg), Train(c), *device, comm));
    ZS_ASSIGN_OR_RETURN(WindowSampler sampler, WindowSampler::Create(&text, c.seq, seed));
    GptRunOptions ro;
    ro.micro_batch = c.micro_batch;
    ro.seq = c.seq;
    ro.recompute = c.recompute;
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<GptTrainer> trainer,
                        GptTrainer::Create(cfg, ro, *engine, comm, *device, &sampler));
    ZS_RETURN_IF_ERROR(InitGptParams(*engine, cfg, seed));
    ZS_RETURN_IF_ERROR(engine->Start());
    for (int step = 0; step < 2; ++step) ZS_RETURN_IF_ERROR(trainer->TrainStep().status());
    const MemoryLedger& ledger = device->ledger();
    Measured m;
    for (int k = 0; k < kNumMemoryCategories; ++k) {
      m.current[k] = ledger.current(static_cast<MemoryCategory>(k));
      m.peak[k] = ledger.peak(static_cast<MemoryCategory>(k));
    }
    m.peak_total = ledger.peak_total();
    std::lock_guard<std::mutex> lock(mu);
    out[rank] = m;
    return absl::OkStatus();
  }));
  return out;
}

// The estimator builds the trainer's spec from the same config.json: the
// same units and params, shapes, ties and trainable flags (what the engine's
// buffers depend on). They differ, harmlessly for memory, in what only the
// optimizer and tensor parallelism read: the trainer exempts the embeddings
// from weight decay, and the estimator marks tensor-parallel split dims.
TEST(GptEstimateVsLedgerTest, EstimatorSpecIsTheTrainersSpec) {
  std::mt19937_64 rng(Seed() + 1);
  const int64_t heads = 1 + static_cast<int64_t>(rng() % 4);
  const std::string json = GptConfigJson(
      1 + static_cast<int64_t>(rng() % 4), heads, heads * (1 + static_cast<int64_t>(rng() % 16)),
      8 + static_cast<int64_t>(rng() % 100), 2 + static_cast<int64_t>(rng() % 300));
  absl::StatusOr<GptConfig> cfg = ParseGptConfig(json, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  absl::StatusOr<ModelDescription> model = ModelFromHfConfig(json, "config.json");
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelSpec trainer = BuildGptModelSpec(*cfg);
  const ModelSpec& estimator = model->spec;
  ASSERT_EQ(estimator.units.size(), trainer.units.size()) << json;
  for (size_t u = 0; u < trainer.units.size(); ++u) {
    const UnitSpec& a = estimator.units[u];
    const UnitSpec& b = trainer.units[u];
    EXPECT_EQ(a.name, b.name);
    ASSERT_EQ(a.params.size(), b.params.size()) << b.name;
    for (size_t p = 0; p < b.params.size(); ++p) {
      const std::string where = b.name + "." + b.params[p].name + "; " + SeedTrace();
      EXPECT_EQ(a.params[p].name, b.params[p].name) << where;
      EXPECT_EQ(a.params[p].shape, b.params[p].shape) << where;
      EXPECT_EQ(a.params[p].trainable, b.params[p].trainable) << where;
      ASSERT_EQ(a.params[p].tied_to.has_value(), b.params[p].tied_to.has_value()) << where;
      if (b.params[p].tied_to) {
        EXPECT_EQ(a.params[p].tied_to->unit, b.params[p].tied_to->unit) << where;
        EXPECT_EQ(a.params[p].tied_to->param, b.params[p].tied_to->param) << where;
      }
    }
  }
  EXPECT_EQ(estimator.NumParams(), trainer.NumParams());
  EXPECT_EQ(estimator.NumStoredParams(), trainer.NumStoredParams());
}

TEST(GptEstimateVsLedgerTest, EstimateEqualsTheTrainersLedgerAtThreeConfigurations) {
  const uint64_t seed = Seed();
  std::mt19937_64 rng(seed);
  // Small fresh sizes: 2-3 layers, 2 or 4 heads of 8, vocab 256 (bytes).
  const int64_t layers = 2 + static_cast<int64_t>(rng() % 2);
  const int64_t heads = rng() % 2 == 0 ? 2 : 4;
  const std::string json = GptConfigJson(layers, heads, heads * 8, /*positions=*/64, /*vocab=*/256);
  absl::StatusOr<GptConfig> cfg = ParseGptConfig(json, "config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  // The estimator reads the same file.
  absl::StatusOr<ModelDescription> model = ModelFromHfConfig(json, "config.json");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<uint8_t> text = RandomText(seed, 6000);

  const Config configs[] = {
      {/*stage=*/1, /*recompute=*/false, Precision::kFp32, /*accum=*/1, /*seq=*/32},
      {/*stage=*/3, /*recompute=*/true, Precision::kFp32, /*accum=*/1, /*seq=*/64},
      {/*stage=*/2, /*recompute=*/false, Precision::kBf16Mixed, /*accum=*/2, /*seq=*/48},
  };
  for (const Config& c : configs) {
    const std::string where = Describe(c) + "; " + SeedTrace();
    ClusterSpec cluster;
    cluster.gpus = cluster.gpus_per_node = kRanks;
    cluster.reserve_bytes = 0;  // CPU ranks
    cluster.workspace_bytes = 0;
    PlanOptions o;
    o.activations = ActivationModel::kGptExample;
    o.stage = c.stage;
    o.precision = c.precision;
    o.recompute = c.recompute ? Recompute::kFull : Recompute::kNone;
    o.seq = c.seq;
    o.micro_batch = c.micro_batch;
    o.grad_accum_steps = c.accum;
    o.prefetch_depth = Train(c).prefetch_units + 1;  // gather buffers: ahead + in use
    auto plan = Planner::Plan(*model, cluster, o);
    ASSERT_TRUE(plan.ok()) << plan.status() << " " << where;
    ASSERT_EQ(plan->candidates.size(), 1u);
    const MemoryBreakdown& est = plan->candidates[0].per_gpu;

    auto ranks = Measure(*cfg, c, text, seed);
    ASSERT_TRUE(ranks.ok()) << ranks.status() << " " << where;
    for (int r = 0; r < kRanks; ++r) {
      const Measured& m = (*ranks)[r];
      int64_t model_states = 0;
      for (int k = 0; k < kNumMemoryCategories; ++k) {
        const auto cat = static_cast<MemoryCategory>(k);
        if (IsModelState(cat)) {
          model_states += m.current[k];
          EXPECT_EQ(m.current[k], testing::PlannedBytes(est, cat))
              << MemoryCategoryName(cat) << ", " << where;
        }
      }
      EXPECT_EQ(model_states, est.model_states()) << where;
      EXPECT_EQ(m.current[static_cast<int>(MemoryCategory::kCommBuffers)], est.buffers) << where;
      const double act_ratio =
          static_cast<double>(m.peak[static_cast<int>(MemoryCategory::kActivations)]) /
          static_cast<double>(est.activations);
      const double ws_ratio =
          static_cast<double>(m.peak[static_cast<int>(MemoryCategory::kWorkspace)]) /
          static_cast<double>(est.workspace);
      const double peak_ratio =
          static_cast<double>(m.peak_total) / static_cast<double>(est.total());
      // The acceptance asks for 10%; the estimate counts the trainer's own
      // tensors, so anything but equality is a drift between the two.
      EXPECT_EQ(m.peak[static_cast<int>(MemoryCategory::kActivations)], est.activations)
          << "activations, x" << act_ratio << ", " << where;
      EXPECT_EQ(m.peak[static_cast<int>(MemoryCategory::kWorkspace)], est.workspace)
          << "workspace, x" << ws_ratio << ", " << where;
      EXPECT_EQ(m.peak_total, est.total()) << "peak, x" << peak_ratio << ", " << where;
      if (r == 0) {
        std::printf(
            "%-60s model states %9lld (est %9lld) buffers %8lld (est %8lld) activations %9lld "
            "(x%.4f) workspace %8lld (x%.4f) peak %9lld (x%.4f)\n",
            Describe(c).c_str(), static_cast<long long>(model_states),
            static_cast<long long>(est.model_states()),
            static_cast<long long>(m.current[static_cast<int>(MemoryCategory::kCommBuffers)]),
            static_cast<long long>(est.buffers),
            static_cast<long long>(m.peak[static_cast<int>(MemoryCategory::kActivations)]),
            act_ratio, static_cast<long long>(m.peak[static_cast<int>(MemoryCategory::kWorkspace)]),
            ws_ratio, static_cast<long long>(m.peak_total), peak_ratio);
      }
    }
  }
}

}  // namespace
}  // namespace gpt
}  // namespace zeroshard
