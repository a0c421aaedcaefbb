// mlp_block_bench: where the residual-MLP example's forward + backward time
// goes, on one thread at the demo's shapes, part by part, against the
// machine's single-thread sgemm peak and the trainer's measured compute.
//
//   build-dev/perf/examples/mlp_block_bench --hidden 512 --blocks 8 --micro-batch 32
//
// Each round runs one micro-batch through every block as the trainer does
// (examples/mlp/internal/block_math.cc, step by step, each step timed on its
// own), and then the same micro-batch through the real BlockForward /
// BlockBackward untimed inside ("whole"), so that the parts' sum can be
// checked against the code they mirror. Figures are medians over --rounds
// rounds, in ms per micro-batch (all blocks). Then the real MlpTrainer on one
// rank (stage 0, fp32, accum 1: one micro-batch per step) runs --trainer-steps
// steps and reports StepTimes::compute per step (median): forward, loss,
// backward and the gradient writes into the engine's views.
//
// Informational lines, not in the sum: what the trainer does only with bf16
// views (weight widening, gradient rounding), and what a fresh allocation of
// the activations per micro-batch would cost (the trainer allocates them once).
#include <cblas.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cli/flags.h"
#include "examples/common/median.h"
#include "examples/mlp/internal/block_math.h"
#include "examples/mlp/internal/view_convert.h"
#include "examples/mlp/mlp.h"
#include "examples/mlp/model_flags.h"
#include "perf/bench_main.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"
#include "zeroshard/train_spec.h"

extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);

namespace zeroshard {
namespace {

using mlp::internal::BlockGradients;
using mlp::internal::BlockWeights;

struct BenchOptions {
  mlp::MlpConfig model = mlp::MlpShape(/*hidden=*/512, /*blocks=*/8, /*micro_batch=*/32);
  int rounds = 15;
  int warmup = 3;
  int trainer_steps = 15;
  int64_t peak_n = 2048;
};

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// This thread's CPU time: on a shared machine, the time other processes
// take from us is not ours (wall time is printed beside it for the whole).
double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// One timed part: its name, and, for a product, its shape and FLOPs per call.
struct Part {
  std::string name;
  std::string shape;   // "M x N x K layout" for an sgemm, else empty
  double flops = 0.0;  // per micro-batch (all blocks)
  bool in_sum = true;  // informational lines are not part of the micro-batch
  std::vector<double> ms_per_round;
};

// Accumulates the time of each named part within one round.
class Rounds {
 public:
  // Registers a part (once; later calls with the same name only time it).
  void Time(const std::string& name, const std::function<void()>& fn, const std::string& shape = "",
            double flops = 0.0, bool in_sum = true) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      it = index_.emplace(name, parts_.size()).first;
      parts_.push_back({name, shape, 0.0, in_sum, {}});
      current_.push_back(0.0);
      flops_this_round_.push_back(0.0);
    }
    const double start = ThreadCpuMs();
    fn();
    current_[it->second] += ThreadCpuMs() - start;
    flops_this_round_[it->second] += flops;
  }
  void EndRound(bool keep) {
    for (size_t i = 0; i < parts_.size(); ++i) {
      if (keep) parts_[i].ms_per_round.push_back(current_[i]);
      parts_[i].flops = flops_this_round_[i];
      current_[i] = 0.0;
      flops_this_round_[i] = 0.0;
    }
  }
  const std::vector<Part>& parts() const { return parts_; }

 private:
  std::map<std::string, size_t> index_;
  std::vector<Part> parts_;
  std::vector<double> current_;
  std::vector<double> flops_this_round_;
};

// Row-major sgemm as block_math.cc calls it: C [M,N] = op(A) op(B).
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0f,
              c, static_cast<int>(ldc));
}

std::string Shape(int64_t m, int64_t n, int64_t k, const char* layout) {
  return absl::StrCat(m, "x", n, "x", k, " ", layout);
}

// The machine's single-thread sgemm rate at a large square shape (best of 3).
double PeakGflops(int64_t n) {
  std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& e : a) e = normal(rng);
  for (float& e : b) e = normal(rng);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const double start = ThreadCpuMs();
    Gemm(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n);
    if (rep > 0) best = std::min(best, ThreadCpuMs() - start);
  }
  return 2.0 * n * n * n / (best * 1e6);
}

// The model's weights, activations and gradient buffers for one micro-batch.
struct Network {
  std::vector<std::vector<float>> params;  // [unit * 4 + param]
  std::vector<BlockWeights> blocks;
  std::vector<float> x, target, dy, dx, scratch, grads;
  mlp::internal::ForwardState state;
  std::vector<float> view_fp32;     // an fp32 gradient view's storage
  std::vector<uint16_t> view_bf16;  // a bf16 view's storage
};

Network MakeNetwork(const mlp::MlpConfig& cfg) {
  Network net;
  for (int u = 0; u < cfg.blocks; ++u) {
    for (int p = 0; p < mlp::kNumBlockParams; ++p) {
      net.params.push_back(mlp::InitialParam(cfg, u, p));
    }
  }
  for (int u = 0; u < cfg.blocks; ++u) {
    const auto* p = &net.params[static_cast<size_t>(u) * mlp::kNumBlockParams];
    net.blocks.push_back(
        {p[mlp::kW1].data(), p[mlp::kB1].data(), p[mlp::kW2].data(), p[mlp::kB2].data()});
  }
  const int64_t io = cfg.micro_batch * cfg.hidden;
  const int64_t inner = mlp::internal::InnerSize(cfg.hidden);
  mlp::DistributedSampler sampler(cfg, 1, 0, 1);
  net.x.resize(static_cast<size_t>(io));
  net.target.resize(net.x.size());
  sampler.Fill(0, 0, net.x.data(), net.target.data());
  net.dy.resize(net.x.size());
  net.dx.resize(net.x.size());
  net.scratch.resize(static_cast<size_t>(cfg.micro_batch * inner));
  const int64_t unit_numel = 2 * inner * cfg.hidden + inner + cfg.hidden;
  net.grads.resize(static_cast<size_t>(unit_numel));
  net.view_fp32.resize(net.grads.size());
  net.view_bf16.resize(net.grads.size());
  net.state.Resize(cfg.blocks, cfg.micro_batch, cfg.hidden);
  return net;
}

// A UnitView over `data` laid out as [w1 b1 w2 b2].
UnitView ViewOver(void* data, DType dtype, const std::vector<int64_t>& sizes) {
  UnitView view;
  char* at = static_cast<char*>(data);
  for (int64_t n : sizes) {
    view.params.push_back(TensorView{at, dtype, n, nullptr});
    at += n * static_cast<int64_t>(DTypeSize(dtype));
  }
  return view;
}

// One micro-batch, part by part, mirroring BlockForward, MseLoss,
// BlockBackward and MlpTrainer::WriteGrads.
void PartsRound(const mlp::MlpConfig& cfg, Network& net, Rounds& r) {
  namespace mi = mlp::internal;
  const int64_t b = cfg.micro_batch, h = cfg.hidden, inner = mi::InnerSize(h);
  const double gemm_flops = 2.0 * b * h * inner;
  const std::vector<int64_t> sizes = {inner * h, inner, h * inner, h};
  std::copy(net.x.begin(), net.x.end(), net.state.inputs[0].begin());
  for (int u = 0; u < cfg.blocks; ++u) {
    const BlockWeights& w = net.blocks[u];
    const float* x = net.state.inputs[u].data();
    float* pre = net.state.pre[u].data();
    float* act = net.state.act[u].data();
    float* y = net.state.inputs[u + 1].data();
    r.Time(
        "fwd sgemm pre = x W1^T",
        [&] { Gemm(false, true, b, inner, h, x, h, w.w1, h, pre, inner); },
        Shape(b, inner, h, "NT"), gemm_flops);
    r.Time("fwd bias b1 + gelu", [&] { mi::BiasGelu(w.b1, b, inner, pre, act); });
    r.Time(
        "fwd sgemm y = act W2^T",
        [&] { Gemm(false, true, b, h, inner, act, inner, w.w2, inner, y, h); },
        Shape(b, h, inner, "NT"), gemm_flops);
    r.Time("fwd bias b2 + residual", [&] { mi::BiasResidual(w.b2, x, b, h, y); });
  }
  r.Time("loss (mse)",
         [&] { mi::MseLoss(net.state.output().data(), net.target.data(), b * h, net.dy.data()); });
  BlockGradients g;
  g.w1 = net.grads.data();
  g.b1 = g.w1 + sizes[0];
  g.w2 = g.b1 + sizes[1];
  g.b2 = g.w2 + sizes[2];
  const UnitView fp32_view = ViewOver(net.view_fp32.data(), DType::kFloat32, sizes);
  const UnitView bf16_view = ViewOver(net.view_bf16.data(), DType::kBFloat16, sizes);
  for (int u = cfg.blocks - 1; u >= 0; --u) {
    const BlockWeights& w = net.blocks[u];
    const float* x = net.state.inputs[u].data();
    const float* pre = net.state.pre[u].data();
    const float* act = net.state.act[u].data();
    const float* dy = net.dy.data();
    float* dpre = net.scratch.data();
    float* dx = net.dx.data();
    r.Time(
        "bwd sgemm dW2 = dy^T act",
        [&] { Gemm(true, false, h, inner, b, dy, h, act, inner, g.w2, inner); },
        Shape(h, inner, b, "TN"), gemm_flops);
    r.Time("bwd db2 (column sums)", [&] { mi::SumRows(dy, b, h, g.b2); });
    r.Time(
        "bwd sgemm dact = dy W2",
        [&] { Gemm(false, false, b, inner, h, dy, h, w.w2, inner, dpre, inner); },
        Shape(b, inner, h, "NN"), gemm_flops);
    r.Time("bwd gelu' + db1", [&] { mi::GeluBackwardBiasGrad(pre, b, inner, dpre, g.b1); });
    r.Time(
        "bwd sgemm dW1 = dpre^T x",
        [&] { Gemm(true, false, inner, h, b, dpre, inner, x, h, g.w1, h); },
        Shape(inner, h, b, "TN"), gemm_flops);
    if (u > 0) {
      r.Time(
          "bwd sgemm dx = dpre W1",
          [&] { Gemm(false, false, b, h, inner, dpre, inner, w.w1, h, dx, h); },
          Shape(b, h, inner, "NN"), 2.0 * b * h * inner);
      r.Time("bwd residual dx += dy", [&] { mi::AddInPlace(dy, b * h, dx); });
    }
    r.Time("grad write (fp32 view)",
           [&] { (void)mi::WriteUnitFromFp32(net.grads.data(), fp32_view, u, sizes, "bench"); });
    // Informational: what bf16 views add (rounding the gradients, widening
    // the weights, twice: forward and backward).
    r.Time(
        "[bf16] grad write (round)",
        [&] { (void)mi::WriteUnitFromFp32(net.grads.data(), bf16_view, u, sizes, "bench"); }, "",
        0.0, false);
    r.Time(
        "[bf16] weights to fp32 (x2)",
        [&] {
          const float* ptrs[4];
          for (int rep = 0; rep < 2; ++rep) {
            (void)mi::UnitParamsAsFp32(bf16_view, u, sizes, "bench", net.view_fp32.data(), ptrs);
          }
        },
        "", 0.0, false);
    std::swap(net.dy, net.dx);
  }
  r.Time(
      "[alloc] fresh activations",
      [&] {
        mi::ForwardState fresh;
        fresh.Resize(cfg.blocks, b, h);
        std::vector<float> scratch(static_cast<size_t>(b * inner));
        // Touch them as the forward would (first-touch page faults).
        for (int u = 0; u < cfg.blocks; ++u) {
          std::fill(fresh.pre[u].begin(), fresh.pre[u].end(), 1.0f);
          std::fill(fresh.act[u].begin(), fresh.act[u].end(), 1.0f);
        }
        std::fill(scratch.begin(), scratch.end(), 1.0f);
      },
      "", 0.0, false);
}

// The same micro-batch through the real functions, timed as a whole:
// {thread CPU ms, wall ms}.
std::pair<double, double> WholeRound(const mlp::MlpConfig& cfg, Network& net) {
  namespace mi = mlp::internal;
  const int64_t b = cfg.micro_batch, h = cfg.hidden, inner = mi::InnerSize(h);
  const std::vector<int64_t> sizes = {inner * h, inner, h * inner, h};
  const UnitView fp32_view = ViewOver(net.view_fp32.data(), DType::kFloat32, sizes);
  BlockGradients g;
  g.w1 = net.grads.data();
  g.b1 = g.w1 + sizes[0];
  g.w2 = g.b1 + sizes[1];
  g.b2 = g.w2 + sizes[2];
  const double start = ThreadCpuMs();
  const double wall_start = NowMs();
  mi::NetworkForward(net.blocks, b, h, net.x.data(), &net.state);
  mi::MseLoss(net.state.output().data(), net.target.data(), b * h, net.dy.data());
  for (int u = cfg.blocks - 1; u >= 0; --u) {
    mi::BlockBackward(net.blocks[u], b, h, net.state.inputs[u].data(), net.state.pre[u].data(),
                      net.state.act[u].data(), net.dy.data(), net.scratch.data(),
                      u > 0 ? net.dx.data() : nullptr, g);
    (void)mi::WriteUnitFromFp32(net.grads.data(), fp32_view, u, sizes, "bench");
    std::swap(net.dy, net.dx);
  }
  return {ThreadCpuMs() - start, NowMs() - wall_start};
}

// StepTimes::compute per step of the real trainer (one rank, stage 0, fp32,
// accum 1), median over the steps.
absl::StatusOr<double> TrainerComputeMs(const BenchOptions& opts) {
  double median = 0.0;
  ZS_RETURN_IF_ERROR(RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    TrainSpec train;
    train.zero_stage = 0;
    train.precision = Precision::kFp32;
    train.grad_accum_steps = 1;
    train.optimizer.kind = OptimizerKind::kAdamW;
    train.optimizer.lr = 3e-3;
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        mlp::CreateMlpEngine(opts.model, train, *device, comm));
    mlp::MlpTrainer trainer(opts.model, *engine, comm);  // before Start(), as mlp_demo
    ZS_RETURN_IF_ERROR(engine->Start(mlp::TrainerSettings(opts.model)));
    for (int s = 0; s < 2; ++s) ZS_RETURN_IF_ERROR(trainer.TrainStep().status());
    std::vector<double> per_step;
    for (int s = 0; s < opts.trainer_steps; ++s) {
      ZS_RETURN_IF_ERROR(trainer.TrainStep().status());
      per_step.push_back(absl::ToDoubleMilliseconds(engine->Stats().last.compute));
    }
    median = examples::Median(per_step);
    return absl::OkStatus();
  }));
  return median;
}

absl::StatusOr<BenchOptions> ParseFlags(int argc, char** argv, bool* help) {
  BenchOptions opts;
  cli::FlagSet flags;
  mlp::AddModelFlags(flags, &opts.model)
      .Int("rounds", &opts.rounds, 1, cli::kMaxCount)
      .Int("trainer-steps", &opts.trainer_steps, 0, cli::kMaxCount)
      .Int("peak-n", &opts.peak_n, 1, cli::kMaxCount);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  return opts;
}

void PrintUsage() {
  std::printf(
      "usage: mlp_block_bench [--hidden 512] [--blocks 8] [--micro-batch 32] [--rounds 15]\n"
      "                       [--trainer-steps 15 (0: skip)] [--peak-n 2048]\n"
      "The MLP example's forward + backward on one thread, part by part (ms per\n"
      "micro-batch, medians), against the single-thread sgemm peak and the trainer's\n"
      "measured compute per step.\n");
}

int Run(const BenchOptions& opts) {
  mlp::internal::UseSingleThreadedBlas();
  const mlp::MlpConfig& cfg = opts.model;
  const double peak = PeakGflops(opts.peak_n);
  Network net = MakeNetwork(cfg);
  Rounds rounds;
  std::vector<double> whole, whole_wall;
  for (int i = 0; i < opts.warmup + opts.rounds; ++i) {
    const bool keep = i >= opts.warmup;
    PartsRound(cfg, net, rounds);
    rounds.EndRound(keep);
    const std::pair<double, double> ms = WholeRound(cfg, net);
    if (keep) {
      whole.push_back(ms.first);
      whole_wall.push_back(ms.second);
    }
  }
  std::printf(
      "mlp_block_bench: %d blocks x hidden %lld, micro-batch %d, 1 BLAS thread; thread CPU ms "
      "per micro-batch (all blocks), median of %d rounds\n",
      cfg.blocks, static_cast<long long>(cfg.hidden), cfg.micro_batch, opts.rounds);
  // OPENBLAS_CORETYPE, when set (e.g. Haswell on an AVX-512 machine), chooses
  // the kernels at load time instead of OpenBLAS's detection.
  std::printf("BLAS: %s, core %s; sgemm peak (%lld^3 NN, 1 thread): %.1f GFLOP/s\n\n",
              openblas_get_config(), openblas_get_corename(), static_cast<long long>(opts.peak_n),
              peak);
  std::printf("%-30s %-18s %9s %7s %9s %8s\n", "part", "M x N x K", "ms", "share", "GFLOP/s",
              "of peak");
  double sum = 0.0, gemm_ms = 0.0, gemm_flops = 0.0;
  for (const Part& p : rounds.parts()) {
    if (p.in_sum) sum += examples::Median(p.ms_per_round);
  }
  for (const Part& p : rounds.parts()) {
    const double ms = examples::Median(p.ms_per_round);
    if (p.flops > 0) {
      const double gflops = p.flops / (ms * 1e6);
      gemm_ms += ms;
      gemm_flops += p.flops;
      std::printf("%-30s %-18s %9.3f %6.1f%% %9.1f %7.1f%%\n", p.name.c_str(), p.shape.c_str(), ms,
                  100.0 * ms / sum, gflops, 100.0 * gflops / peak);
    } else if (p.in_sum) {
      std::printf("%-30s %-18s %9.3f %6.1f%%\n", p.name.c_str(), "", ms, 100.0 * ms / sum);
    }
  }
  std::printf("%-30s %-18s %9.3f %6.1f%% %9.1f %7.1f%%\n", "all sgemm", "", gemm_ms,
              100.0 * gemm_ms / sum, gemm_flops / (gemm_ms * 1e6),
              100.0 * gemm_flops / (gemm_ms * 1e6) / peak);
  std::printf("%-30s %-18s %9.3f\n", "sum of parts", "", sum);
  std::printf("%-30s %-18s %9.3f   (wall %.3f)\n", "whole (real functions)", "",
              examples::Median(whole), examples::Median(whole_wall));
  std::printf("\nnot in the sum (what the trainer does not do at fp32):\n");
  for (const Part& p : rounds.parts()) {
    if (!p.in_sum)
      std::printf("%-30s %-18s %9.3f\n", p.name.c_str(), "", examples::Median(p.ms_per_round));
  }
  if (opts.trainer_steps > 0) {
    const absl::StatusOr<double> trainer = TrainerComputeMs(opts);
    if (!trainer.ok()) {
      std::fprintf(stderr, "mlp_block_bench: trainer run failed: %s\n",
                   trainer.status().ToString().c_str());
      return 1;
    }
    std::printf(
        "\ntrainer StepTimes::compute per step (1 rank, stage 0, accum 1, median of %d): "
        "%.3f ms; sum of parts / trainer = %.3f\n",
        opts.trainer_steps, *trainer, sum / *trainer);
  }
  return 0;
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BenchMain<zeroshard::BenchOptions>(
      "mlp_block_bench", argc, argv, zeroshard::ParseFlags, [] { zeroshard::PrintUsage(); },
      [](const zeroshard::BenchOptions& opts) { return zeroshard::Run(opts); });
}
