// Issue 19's acceptance: for the MLP example with frozen params (LoRA) and a
// tied param (the LM mode's head reads the embedding), at every ZeRO stage,
// several world sizes, fp32 and bf16 and with and without accumulation, the
// planner's per-rank model-state bytes and buffer bytes equal
//   (a) PlanEngineBuffers (what the engine plans from FlatLayout::Create),
//   (b) the ledger of real engines on local ranks (Engine::Create), and
//   (c) for the model states, a hand count from the shapes written here:
//       params start at multiples of 64 elements within a segment; a
//       segment is padded to world * roundup(ceil(used / world), 128); a
//       unit stores its trainable params in one segment, its frozen ones in
//       another, a tied-to param in one of its own, an alias nowhere.
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "examples/mlp/mlp.h"
#include "gtest/gtest.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/estimate/model_description.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

struct Ledger {
  int64_t model_states = 0;
  int64_t total = 0;
};

absl::StatusOr<std::vector<Ledger>> MeasureRanks(const ModelSpec& spec, const TrainSpec& train,
                                                 int world) {
  std::vector<Ledger> out(world);
  std::mutex mu;
  ZS_RETURN_IF_ERROR(RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, train, *device, comm));
    const MemoryLedger& ledger = device->ledger();
    Ledger m;
    m.model_states = ledger.current_model_states();
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      m.total += ledger.current(static_cast<MemoryCategory>(c));
    }
    std::lock_guard<std::mutex> lock(mu);
    out[rank] = m;
    return absl::OkStatus();
  }));
  return out;
}

// One storage segment of the hand count.
struct Segment {
  int64_t used = 0;
  bool trainable = true;
};

Segment MakeSegment(const std::vector<int64_t>& numels, bool trainable) {
  int64_t cursor = 0;
  for (int64_t n : numels) cursor = (cursor + 63) / 64 * 64 + n;
  return {cursor, trainable};
}

// The segments of the MLP's spec, from MlpConfig's shapes (examples/mlp/
// mlp.h), in the engine's order: per unit trainable, frozen, tied owners.
std::vector<Segment> HandSegments(const mlp::MlpConfig& cfg) {
  const int64_t h = cfg.hidden;
  const int64_t f = 4 * h;
  const int64_t r = cfg.lora_rank;
  const bool base = !cfg.lora();
  std::vector<Segment> out;
  // embed.weight: the head ties to it, so it is a segment of its own.
  if (cfg.lm()) out.push_back(MakeSegment({cfg.vocab * h}, base));
  for (int b = 0; b < cfg.blocks; ++b) {
    if (cfg.lora()) {
      out.push_back(MakeSegment({r * h, f * r, r * f, h * r}, true));
    }
    out.push_back(MakeSegment({f * h, f, h * f, h}, base));
  }
  // head: weight is embed.weight (nothing stored), bias alone.
  if (cfg.lm()) out.push_back(MakeSegment({cfg.vocab}, base));
  return out;
}

int64_t HandModelStates(const mlp::MlpConfig& cfg, int world, int stage, Precision precision) {
  const int64_t param_bytes = precision == Precision::kFp32 ? 4 : 2;
  int64_t params = 0, grads = 0, optimizer = 0;
  for (const Segment& s : HandSegments(cfg)) {
    const int64_t shard = ((s.used + world - 1) / world + 127) / 128 * 128;
    const int64_t padded = world * shard;
    // Stage 3 shards every segment (persistent_unit_numel is 0).
    params += stage >= 3 ? shard : padded;
    if (!s.trainable) continue;
    grads += stage >= 2 ? shard : padded;
    optimizer += stage >= 1 ? shard : padded;
  }
  // Adam's m and v in fp32, and an fp32 master copy under mixed precision.
  const int64_t optimizer_bytes = (precision == Precision::kFp32 ? 8 : 12) * optimizer;
  return (params + grads) * param_bytes + optimizer_bytes;
}

int64_t BufferBytes(const Candidate& c) {
  int64_t total = 0;
  for (const PlacedBuffer& p : c.buffers) total += p.buffer.bytes();
  return total;
}

uint64_t Seed() {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

void CheckConfig(const mlp::MlpConfig& cfg, const std::string& name) {
  ModelDescription model;
  model.name = name;
  model.spec = mlp::BuildModelSpec(cfg);
  ASSERT_TRUE(model.spec.Validate().ok()) << model.spec.Validate();
  ClusterSpec cluster;
  cluster.reserve_bytes = 0;
  cluster.workspace_bytes = 0;
  cluster.gpu_mem_bytes = int64_t{1} << 34;
  for (int world : {1, 2, 3, 4}) {
    cluster.gpus = world;
    cluster.gpus_per_node = world;
    for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
      for (int stage = 0; stage <= 3; ++stage) {
        for (int accum : {1, 2}) {
          const std::string where = name + " world " + std::to_string(world) + " " +
                                    PrecisionName(precision) + " stage " + std::to_string(stage) +
                                    " accum " + std::to_string(accum);
          PlanOptions options;
          options.precision = precision;
          options.stage = stage;
          options.offload = Offload::kNone;
          options.tp = options.pp = 1;
          options.grad_accum_steps = accum;
          auto plan = Planner::Plan(model, cluster, options);
          ASSERT_TRUE(plan.ok()) << where << ": " << plan.status();
          ASSERT_EQ(plan->candidates.size(), 1u) << where;
          const Candidate& c = plan->candidates[0];
          ASSERT_TRUE(c.engine_supported) << where;
          const TrainSpec train = Planner::EngineTrainSpec(options, stage, accum);
          auto engine_plan = PlanEngineBuffers(model.spec, train, world);
          ASSERT_TRUE(engine_plan.ok()) << where << ": " << engine_plan.status();
          const int64_t hand = HandModelStates(cfg, world, stage, precision);
          EXPECT_EQ(c.per_gpu.model_states(), hand) << where;
          EXPECT_EQ(engine_plan->model_state_bytes(), hand) << where;
          EXPECT_EQ(BufferBytes(c), engine_plan->total_bytes()) << where;
          auto ranks = MeasureRanks(model.spec, train, world);
          ASSERT_TRUE(ranks.ok()) << where << ": " << ranks.status();
          for (int r = 0; r < world; ++r) {
            EXPECT_EQ((*ranks)[r].model_states, hand) << where << " rank " << r;
            EXPECT_EQ((*ranks)[r].total, BufferBytes(c)) << where << " rank " << r;
          }
        }
      }
    }
  }
}

TEST(LoraPlanVsLedgerTest, LoraMlpPlanEqualsEngineLedgerAndHandCount) {
  std::mt19937_64 rng(Seed());
  mlp::MlpConfig cfg;
  cfg.hidden = 8 * std::uniform_int_distribution<int64_t>(3, 9)(rng);
  cfg.blocks = std::uniform_int_distribution<int>(2, 4)(rng);
  cfg.micro_batch = 4;
  cfg.lora_rank = std::uniform_int_distribution<int>(1, 9)(rng);
  CheckConfig(cfg, "lora h" + std::to_string(cfg.hidden) + " r" + std::to_string(cfg.lora_rank));
}

TEST(LoraPlanVsLedgerTest, LoraLmMlpWithFrozenTiedEmbeddingPlanEqualsEngineLedger) {
  std::mt19937_64 rng(Seed());
  mlp::MlpConfig cfg;
  cfg.hidden = 8 * std::uniform_int_distribution<int64_t>(3, 9)(rng);
  cfg.blocks = std::uniform_int_distribution<int>(2, 4)(rng);
  cfg.micro_batch = 4;
  cfg.lora_rank = std::uniform_int_distribution<int>(1, 9)(rng);
  cfg.vocab = std::uniform_int_distribution<int64_t>(20, 300)(rng);
  CheckConfig(cfg, "lora+lm h" + std::to_string(cfg.hidden) + " V" + std::to_string(cfg.vocab));
}

// The trainable tied embedding: its gradient has two writers (a staged
// second use and, when accumulating, the tied accumulator).
TEST(LoraPlanVsLedgerTest, LmMlpWithTrainableTiedEmbeddingPlanEqualsEngineLedger) {
  std::mt19937_64 rng(Seed());
  mlp::MlpConfig cfg;
  cfg.hidden = 8 * std::uniform_int_distribution<int64_t>(3, 9)(rng);
  cfg.blocks = std::uniform_int_distribution<int>(2, 4)(rng);
  cfg.micro_batch = 4;
  cfg.vocab = std::uniform_int_distribution<int64_t>(20, 300)(rng);
  CheckConfig(cfg, "lm h" + std::to_string(cfg.hidden) + " V" + std::to_string(cfg.vocab));
}

}  // namespace
}  // namespace zeroshard
