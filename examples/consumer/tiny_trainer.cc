// tiny_trainer: a complete, minimal trainer on the public zeroshard API,
// built outside the zeroshard tree (examples/consumer/CMakeLists.txt).
//
// Model: y = W2 relu(W1 x + b1), fitted to a fixed random teacher of the
// same shape by mean squared error, on 2 in-process ranks with ZeRO stage 2.
// Before the engine exists the trainer asks the planner what each rank will
// allocate, and what the estimator would choose for a 7B model on 8 GPUs.
// Exit 0 when the loss fell by 10x and the ledger equals the plan.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <vector>

#include "zeroshard/buffer_plan.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/status.h"

namespace {

using namespace zeroshard;  // NOLINT: a short example

constexpr int kIn = 16, kHidden = 32, kBatch = 8, kRanks = 2, kSteps = 300;

ModelSpec TinyModel() {
  ModelSpec spec;
  spec.units.push_back({"layer1", {{"w", {kHidden, kIn}, false}, {"b", {kHidden}, true}}});
  spec.units.push_back({"layer2", {{"w", {kIn, kHidden}, false}}});
  return spec;
}

TrainSpec TinyTraining() {
  TrainSpec train;
  train.zero_stage = 2;
  train.optimizer.lr = 1e-2;
  train.max_grad_norm = 1.0;
  return train;
}

std::vector<float> Random(std::mt19937_64& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Inputs and the teacher's outputs of global step `step`; every rank draws
// the whole global batch from the same seed and keeps its own rows.
void Batch(int64_t step, int rank, std::vector<float>* x, std::vector<float>* y) {
  std::mt19937_64 teacher_rng(7);
  const std::vector<float> t1 = Random(teacher_rng, kHidden * kIn, 0.3f);
  const std::vector<float> t2 = Random(teacher_rng, kIn * kHidden, 0.3f);
  std::mt19937_64 data_rng(1000 + step);
  const std::vector<float> all = Random(data_rng, kRanks * kBatch * kIn, 1.0f);
  x->assign(all.begin() + rank * kBatch * kIn, all.begin() + (rank + 1) * kBatch * kIn);
  y->assign(kBatch * kIn, 0.0f);
  for (int s = 0; s < kBatch; ++s) {
    std::vector<float> h(kHidden, 0.0f);
    for (int j = 0; j < kHidden; ++j) {
      for (int i = 0; i < kIn; ++i) h[j] += t1[j * kIn + i] * (*x)[s * kIn + i];
      h[j] = std::max(h[j], 0.0f);
    }
    for (int i = 0; i < kIn; ++i) {
      for (int j = 0; j < kHidden; ++j) (*y)[s * kIn + i] += t2[i * kHidden + j] * h[j];
    }
  }
}

// One rank: plan, create, set weights, train; returns the first and last loss.
absl::Status TrainRank(int rank, Communicator& comm, double* first, double* last,
                       bool* ledger_matches) {
  const ModelSpec spec = TinyModel();
  const TrainSpec train = TinyTraining();
  ZS_ASSIGN_OR_RETURN(BufferPlan plan, PlanEngineBuffers(spec, train, comm.size()));
  std::unique_ptr<Device> device = CreateCpuDevice();
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(spec, train, *device, comm));
  *ledger_matches = device->ledger().current_total() == plan.total_bytes();
  std::mt19937_64 init(42);  // the same initial weights on every rank
  for (int u = 0; u < 2; ++u) {
    for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
      const int64_t n = spec.units[u].params[p].NumElements();
      ZS_RETURN_IF_ERROR(engine->SetParam(u, static_cast<int>(p), Random(init, n, 0.2f)));
    }
  }
  ZS_RETURN_IF_ERROR(engine->Start({TrainerSetting::Int("batch", kBatch)}));
  std::vector<float> x, y, h(kBatch * kHidden), a(kBatch * kHidden), out(kBatch * kIn);
  for (int64_t step = 0; step < kSteps; ++step) {
    Batch(step, rank, &x, &y);
    // Forward.
    ZS_ASSIGN_OR_RETURN(UnitView l1, engine->Gather(0));
    const float* w1 = l1.params[0].as<float>();
    const float* b1 = l1.params[1].as<float>();
    for (int s = 0; s < kBatch; ++s) {
      for (int j = 0; j < kHidden; ++j) {
        float v = b1[j];
        for (int i = 0; i < kIn; ++i) v += w1[j * kIn + i] * x[s * kIn + i];
        h[s * kHidden + j] = v;
        a[s * kHidden + j] = std::max(v, 0.0f);
      }
    }
    ZS_RETURN_IF_ERROR(engine->Release(0));
    ZS_ASSIGN_OR_RETURN(UnitView l2, engine->Gather(1));
    const float* w2 = l2.params[0].as<float>();
    double loss = 0;
    std::vector<float> dout(kBatch * kIn);
    for (int s = 0; s < kBatch; ++s) {
      for (int i = 0; i < kIn; ++i) {
        float v = 0;
        for (int j = 0; j < kHidden; ++j) v += w2[i * kHidden + j] * a[s * kHidden + j];
        const float d = v - y[s * kIn + i];
        loss += d * d / (kBatch * kIn);
        dout[s * kIn + i] = 2 * d / (kBatch * kIn);
      }
    }
    // Backward: layer 2, then layer 1; each unit's gradient is reduced as
    // soon as it is written.
    std::vector<float> da(kBatch * kHidden, 0.0f);
    ZS_ASSIGN_OR_RETURN(UnitView g2, engine->GradView(1));
    float* gw2 = g2.params[0].as<float>();
    std::fill(gw2, gw2 + kIn * kHidden, 0.0f);
    for (int s = 0; s < kBatch; ++s) {
      for (int i = 0; i < kIn; ++i) {
        for (int j = 0; j < kHidden; ++j) {
          gw2[i * kHidden + j] += dout[s * kIn + i] * a[s * kHidden + j];
          da[s * kHidden + j] += dout[s * kIn + i] * w2[i * kHidden + j];
        }
      }
    }
    ZS_RETURN_IF_ERROR(engine->ReduceGrads(1));
    ZS_RETURN_IF_ERROR(engine->Release(1));
    ZS_RETURN_IF_ERROR(engine->Gather(0).status());  // the loop every stage runs (stage 3 needs it)
    ZS_ASSIGN_OR_RETURN(UnitView g1, engine->GradView(0));
    float* gw1 = g1.params[0].as<float>();
    float* gb1 = g1.params[1].as<float>();
    std::fill(gw1, gw1 + kHidden * kIn, 0.0f);
    std::fill(gb1, gb1 + kHidden, 0.0f);
    for (int s = 0; s < kBatch; ++s) {
      for (int j = 0; j < kHidden; ++j) {
        const float dh = h[s * kHidden + j] > 0 ? da[s * kHidden + j] : 0.0f;
        gb1[j] += dh;
        for (int i = 0; i < kIn; ++i) gw1[j * kIn + i] += dh * x[s * kIn + i];
      }
    }
    ZS_RETURN_IF_ERROR(engine->ReduceGrads(0));
    ZS_RETURN_IF_ERROR(engine->Release(0));
    ZS_RETURN_IF_ERROR(engine->Step().status());
    // The mean loss over both ranks' batches.
    ZS_RETURN_IF_ERROR(comm.AllReduceSync(&loss, &loss, 1, DType::kFloat64));
    loss /= comm.size();
    if (step == 0) *first = loss;
    *last = loss;
  }
  return absl::OkStatus();
}

}  // namespace

int main() {
  // What the estimator would choose for Llama-2-7B on 8 x 80 GiB.
  absl::StatusOr<ModelDescription> llama = ModelFromPreset("llama-2-7b");
  if (!llama.ok()) return 1;
  absl::StatusOr<Plan> estimate = Planner::Plan(*llama, ClusterSpec{}, PlanOptions{});
  if (!estimate.ok() || estimate->chosen_candidate() == nullptr) return 1;
  std::printf("estimator: llama-2-7b on 8 x 80 GiB -> %s (%.1f GiB per GPU)\n",
              estimate->chosen_candidate()->Label().c_str(),
              static_cast<double>(estimate->chosen_candidate()->per_gpu.total()) / (1 << 30));

  absl::StatusOr<BufferPlan> plan = PlanEngineBuffers(TinyModel(), TinyTraining(), kRanks);
  if (!plan.ok()) return 1;
  std::printf("plan: %d ranks, ZeRO stage 2, %lld bytes per rank:", kRanks,
              static_cast<long long>(plan->total_bytes()));
  for (const PlannedBuffer& b : plan->buffers) {
    std::printf(" %s %lld", b.name.c_str(), static_cast<long long>(b.bytes()));
  }
  std::printf("\n");

  std::mutex mu;
  double first = 0, last = 0;
  bool ledger_ok = true;
  const absl::Status status = RunLocalRanks(kRanks, [&](int rank, Communicator& comm) {
    double f = 0, l = 0;
    bool matches = false;
    absl::Status s = TrainRank(rank, comm, &f, &l, &matches);
    std::lock_guard<std::mutex> lock(mu);
    ledger_ok = ledger_ok && matches;
    if (rank == 0) first = f, last = l;
    return s;
  });
  if (!status.ok()) {
    std::fprintf(stderr, "tiny_trainer: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("loss %.6f -> %.6f after %d steps; ledger equals plan on every rank: %s\n", first,
              last, kSteps, ledger_ok ? "yes" : "no");
  return last < first / 10 && ledger_ok ? 0 : 1;
}
