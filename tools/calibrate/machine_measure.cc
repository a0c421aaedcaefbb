#include "tools/calibrate/machine_measure.h"

#include <cblas.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/offload.h"
#include "zeroshard/status.h"
#include "zeroshard/train_spec.h"

#if ZS_HAVE_CPU_BLAS
#include "examples/common/cpu_blas.h"
#endif

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_config(void);

namespace zeroshard::tools {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Runs `body` (one repetition) once untimed, then in 5 batches that
// together take at least min_seconds (each at least `min_reps` times);
// returns the fastest batch's seconds per repetition: the machine's rate,
// as far as other processes on a shared machine let it show.
template <typename Body>
double TimePerRep(double min_seconds, int min_reps, Body body) {
  body();
  double best = 0;
  for (int batch = 0; batch < 5; ++batch) {
    int reps = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    while (reps < min_reps || elapsed < min_seconds / 5) {
      body();
      ++reps;
      elapsed = SecondsSince(start);
    }
    const double per_rep = elapsed / reps;
    if (batch == 0 || per_rep < best) best = per_rep;
  }
  return best;
}

std::vector<float> Normals(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// The example's GELU and its derivative (examples/mlp/internal/block_math.cc):
// the standard exact GELU, written here so the tool needs no example code.
float Gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
float GeluGrad(float x) {
  const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * std::exp(-0.5f * x * x);
  return cdf + x * pdf;
}

std::string FirstCpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

ModelSpec MlpSpec(const MeasureShapes& s) {
  const int64_t h = s.hidden, inner = 4 * s.hidden;
  ModelSpec spec;
  for (int b = 0; b < s.blocks; ++b) {
    UnitSpec unit;
    unit.name = absl::StrCat("block.", b);
    unit.params = {ParamSpec{"w1", {inner, h}}, ParamSpec{"b1", {inner}},
                   ParamSpec{"w2", {h, inner}}, ParamSpec{"b2", {h}}};
    unit.params[1].no_decay = unit.params[3].no_decay = true;
    spec.units.push_back(unit);
  }
  return spec;
}

// The trainers' kernel path: OpenBLAS's core chosen for this CPU (once per
// process), so that the profile's sgemm rate and BLAS name are theirs.
void UseTrainersBlas() {
#if ZS_HAVE_CPU_BLAS
  examples::SetUpCpuBlas();
#endif
}

}  // namespace

void DescribeMachine(MachineProfile* p) {
  UseTrainersBlas();
  char host[256] = {};
  p->machine = gethostname(host, sizeof(host) - 1) == 0 ? host : "unknown";
  p->cpu = FirstCpuModel();
  cpu_set_t set;
  p->cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  p->date = date;
  p->blas = openblas_get_config();  // "OpenBLAS 0.3.21 ... Haswell ..."
}

double MeasureSgemmFlopsPerS(const MeasureShapes& s) {
  UseTrainersBlas();
  openblas_set_num_threads(s.blas_threads);
  const int64_t b = s.micro_batch, h = s.hidden, inner = 4 * s.hidden;
  std::vector<std::vector<float>> w1, w2;
  for (int k = 0; k < s.blocks; ++k) {
    w1.push_back(Normals(static_cast<size_t>(inner * h), 10 + k));
    w2.push_back(Normals(static_cast<size_t>(h * inner), 100 + k));
  }
  std::vector<float> x = Normals(b * h, 1), wide = Normals(b * inner, 2), wide2(b * inner),
                     out(b * h), gw(inner * h);
  int block = 0;
  // One block's forward and backward products, the trainer's shapes and
  // transposes (BlockForwardPartial, BlockBackwardPartial).
  auto one_block = [&] {
    const float* a = w1[block].data();
    const float* c = w2[block].data();
    block = (block + 1) % s.blocks;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, inner, h, 1.0f, x.data(), h, a, h, 0.0f,
                wide.data(), inner);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, h, inner, 1.0f, wide.data(), inner, c,
                inner, 0.0f, out.data(), h);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, h, inner, b, 1.0f, out.data(), h,
                wide.data(), inner, 0.0f, gw.data(), inner);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, inner, h, 1.0f, out.data(), h, c,
                inner, 0.0f, wide2.data(), inner);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, inner, h, b, 1.0f, wide2.data(), inner,
                x.data(), h, 0.0f, gw.data(), h);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, h, inner, 1.0f, wide2.data(), inner,
                a, h, 0.0f, out.data(), h);
    // Keep values bounded across repetitions.
    for (float& v : out) v *= 1e-3f;
  };
  const double seconds = TimePerRep(s.min_seconds, s.blocks, one_block);
  return 6.0 * 2.0 * static_cast<double>(b * inner * h) / seconds;
}

void MeasureGelu(const MeasureShapes& s, double gelu[2]) {
  const size_t n = static_cast<size_t>(s.blocks * s.micro_batch * 4 * s.hidden);
  const std::vector<float> pre = Normals(n, 3);
  std::vector<float> act(n);
  volatile float sink = 0;
  gelu[0] = TimePerRep(s.min_seconds / 2, 3,
                       [&] {
                         for (size_t i = 0; i < n; ++i) act[i] = Gelu(pre[i]);
                         sink = sink + act[n / 2];
                       }) /
            static_cast<double>(n);
  // As the backward: dpre *= gelu'(pre), in place.
  std::fill(act.begin(), act.end(), 1.0f);
  gelu[1] = TimePerRep(s.min_seconds / 2, 3,
                       [&] {
                         for (size_t i = 0; i < n; ++i) act[i] *= GeluGrad(pre[i]);
                         std::fill(act.begin(), act.begin() + 1, 1.0f);
                         sink = sink + act[n / 2];
                       }) /
            static_cast<double>(n);
}

double MeasureCopyBytesPerS(const MeasureShapes& s) {
  const size_t numel = static_cast<size_t>(8 * s.hidden * s.hidden + 5 * s.hidden);
  std::vector<std::vector<float>> src;
  for (int k = 0; k < s.blocks; ++k) src.push_back(Normals(numel, 20 + k));
  std::vector<float> dst(numel);
  int block = 0;
  const double seconds = TimePerRep(s.min_seconds / 2, s.blocks, [&] {
    std::memcpy(dst.data(), src[block].data(), numel * sizeof(float));
    block = (block + 1) % s.blocks;
  });
  return static_cast<double>(numel * sizeof(float)) / seconds;
}

absl::Status MeasureOffloadRates(const std::string& dir, int64_t nvme_bytes, double min_seconds,
                                 MachineProfile::Offload* rates) {
  // The engine's default chunk: OffloadSpec::chunk_numel fp32 elements.
  const int64_t chunk_bytes = OffloadSpec{}.chunk_numel * 4;
  {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device->CreateStream());
    const std::vector<float> grads = Normals(static_cast<size_t>(chunk_bytes / 4), 70);
    std::vector<float> host(grads.size()), params(grads.size());
    const double seconds = TimePerRep(min_seconds, 4, [&] {
      // Out and back, as one chunk of the optimizer phase moves.
      (void)device->CopyAsync(host.data(), grads.data(), chunk_bytes, *stream);
      (void)device->CopyAsync(params.data(), host.data(), chunk_bytes, *stream);
      (void)stream->Synchronize();
    });
    rates->host_copy_bytes_per_s = 2.0 * static_cast<double>(chunk_bytes) / seconds;
  }
  const int64_t bytes = (std::max(nvme_bytes, chunk_bytes) + 4095) / 4096 * 4096;
  constexpr int kInFlight = 2;
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<SwapFileProbe> probe,
                      SwapFileProbe::Create(dir, {bytes}, chunk_bytes, kInFlight));
  // The write first, so that the read finds written blocks (not holes).
  ZS_ASSIGN_OR_RETURN(const double write_s, probe->Pass(/*write=*/true));
  ZS_ASSIGN_OR_RETURN(const double read_s, probe->Pass(/*write=*/false));
  const double disk_bytes = static_cast<double>(probe->bytes());
  rates->nvme_write_bytes_per_s = disk_bytes / std::max(write_s, 1e-9);
  rates->nvme_read_bytes_per_s = disk_bytes / std::max(read_s, 1e-9);
  rates->io_backend = probe->Describe();
  rates->dir = dir;
  return absl::OkStatus();
}

absl::StatusOr<double> MeasureOptimizerSPerParam(const MeasureShapes& s) {
  const ModelSpec spec = MlpSpec(s);
  TrainSpec train;  // as perf/runtime/step_bench.cc's MakeTrainSpec
  train.zero_stage = 0;
  train.precision = Precision::kFp32;
  train.optimizer.kind = OptimizerKind::kAdamW;
  train.optimizer.lr = 3e-3;
  train.optimizer.weight_decay = 0.01;
  train.max_grad_norm = 2.0;
  double seconds_per_param = 0;
  ZS_RETURN_IF_ERROR(RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(spec, train, *device, comm));
    for (int u = 0; u < s.blocks; ++u) {
      for (int p = 0; p < 4; ++p) {
        const std::vector<float> init =
            Normals(static_cast<size_t>(spec.units[u].params[p].NumElements()), 40 + 4 * u + p);
        ZS_RETURN_IF_ERROR(engine->SetParam(u, p, init));
      }
    }
    ZS_RETURN_IF_ERROR(engine->Start());
    const std::vector<float> grad = Normals(static_cast<size_t>(spec.units[0].NumElements()), 7);
    auto step = [&]() -> absl::Status {
      for (int u = s.blocks - 1; u >= 0; --u) {
        ZS_RETURN_IF_ERROR(engine->Gather(u).status());
        ZS_ASSIGN_OR_RETURN(const UnitView view, engine->GradView(u));
        size_t at = 0;
        for (const TensorView& t : view.params) {
          std::memcpy(t.data, grad.data() + at, static_cast<size_t>(t.numel) * sizeof(float));
          at += static_cast<size_t>(t.numel);
        }
        ZS_RETURN_IF_ERROR(engine->ReduceGrads(u));
        ZS_RETURN_IF_ERROR(engine->Release(u));
      }
      return engine->Step().status();
    };
    ZS_RETURN_IF_ERROR(step());  // warm-up
    const EngineStats before = engine->Stats();
    const auto start = Clock::now();
    int steps = 0;
    while (steps < 3 || SecondsSince(start) < s.min_seconds) {
      ZS_RETURN_IF_ERROR(step());
      ++steps;
    }
    const EngineStats after = engine->Stats();
    const double optimizer_s =
        absl::ToDoubleSeconds(after.totals.optimizer - before.totals.optimizer) / steps;
    seconds_per_param = optimizer_s / static_cast<double>(spec.NumParams());
    return absl::OkStatus();
  }));
  return seconds_per_param;
}

CollectiveFit FitAlphaBeta(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  CollectiveFit fit;
  fit.sizes_bytes = bytes;
  fit.seconds = seconds;
  const double n = static_cast<double>(bytes.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    sx += bytes[i];
    sy += seconds[i];
    sxx += bytes[i] * bytes[i];
    sxy += bytes[i] * seconds[i];
  }
  const double denom = n * sxx - sx * sx;
  double slope = denom > 0 ? (n * sxy - sx * sy) / denom : 0.0;
  double intercept = (sy - slope * sx) / n;
  if (!(slope > 0)) {
    slope = seconds.back() / bytes.back();
    intercept = 0;
  }
  if (intercept < 0) {
    // Through the origin instead: the least-squares slope with alpha = 0.
    intercept = 0;
    slope = sxy / sxx;
  }
  fit.alpha_s = intercept;
  fit.beta_bytes_per_s = 1.0 / slope;
  return fit;
}

absl::StatusOr<CollectiveProfile> MeasureCollectives(Communicator& comm,
                                                     const std::vector<int64_t>& sizes,
                                                     double min_seconds) {
  const int n = comm.size();
  CollectiveProfile out;
  CollectiveFit* fits[] = {&out.all_reduce, &out.reduce_scatter, &out.all_gather};
  for (int op = 0; op < 3; ++op) {
    std::vector<double> xs, ys;
    for (const int64_t size : sizes) {
      const int64_t count = std::max<int64_t>(n, size / 4 / n * n);  // a multiple of n floats
      std::vector<float> send = Normals(static_cast<size_t>(count), 50 + comm.rank());
      std::vector<float> recv(static_cast<size_t>(count));
      auto issue = [&]() -> absl::Status {
        if (op == 0) return comm.AllReduce(send.data(), recv.data(), count, DType::kFloat32).Wait();
        if (op == 1) {
          return comm.ReduceScatter(send.data(), recv.data(), count / n, DType::kFloat32).Wait();
        }
        return comm.AllGather(send.data(), recv.data(), count / n, DType::kFloat32).Wait();
      };
      for (int w = 0; w < 2; ++w) ZS_RETURN_IF_ERROR(issue());
      // Every rank must run the same repetitions: a short trial, then as
      // many as fit in min_seconds on the slowest rank.
      ZS_RETURN_IF_ERROR(comm.BarrierSync());
      auto t0 = Clock::now();
      for (int w = 0; w < 3; ++w) ZS_RETURN_IF_ERROR(issue());
      const double trial = SecondsSince(t0) / 3;
      // The slowest rank's trial time sets the count.
      std::vector<double> all(static_cast<size_t>(n));
      ZS_RETURN_IF_ERROR(comm.AllGatherSync(&trial, all.data(), 1, DType::kFloat64));
      const double slowest = *std::max_element(all.begin(), all.end());
      const int reps = std::clamp(static_cast<int>(min_seconds / std::max(slowest, 1e-9)), 3, 2000);
      ZS_RETURN_IF_ERROR(comm.BarrierSync());
      t0 = Clock::now();
      for (int r = 0; r < reps; ++r) ZS_RETURN_IF_ERROR(issue());
      const double mine = SecondsSince(t0) / reps;
      ZS_RETURN_IF_ERROR(comm.AllGatherSync(&mine, all.data(), 1, DType::kFloat64));
      xs.push_back(static_cast<double>(count) * 4.0);
      ys.push_back(*std::max_element(all.begin(), all.end()));
    }
    *fits[op] = FitAlphaBeta(xs, ys);
  }
  return out;
}

absl::StatusOr<CollectiveFit> MeasurePingPong(Communicator& comm, int a, int b,
                                              const std::vector<int64_t>& sizes,
                                              double min_seconds) {
  const int me = comm.rank();
  const bool in_pair = me == a || me == b;
  const int peer = me == a ? b : a;
  std::vector<double> xs, ys;
  uint64_t tag = 0;
  for (const int64_t size : sizes) {
    std::vector<uint8_t> buf(static_cast<size_t>(size));
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + me);
    // One round trip, started by a.
    auto round_trip = [&]() -> absl::Status {
      ++tag;
      if (me == a) {
        ZS_RETURN_IF_ERROR(comm.Send(buf.data(), size, DType::kUInt8, peer, tag).Wait());
        return comm.Recv(buf.data(), size, DType::kUInt8, peer, tag).Wait();
      }
      ZS_RETURN_IF_ERROR(comm.Recv(buf.data(), size, DType::kUInt8, peer, tag).Wait());
      return comm.Send(buf.data(), size, DType::kUInt8, peer, tag).Wait();
    };
    double trial = 0;
    if (in_pair) {
      for (int w = 0; w < 2; ++w) ZS_RETURN_IF_ERROR(round_trip());
      const auto t0 = Clock::now();
      for (int w = 0; w < 3; ++w) ZS_RETURN_IF_ERROR(round_trip());
      trial = SecondsSince(t0) / 3;
    }
    // a's trial sets how many round trips both run.
    ZS_RETURN_IF_ERROR(comm.Broadcast(&trial, 1, DType::kFloat64, a).Wait());
    const int reps = std::clamp(static_cast<int>(min_seconds / std::max(trial, 1e-9)), 3, 5000);
    double one_way = 0;
    if (in_pair) {
      const auto t0 = Clock::now();
      for (int r = 0; r < reps; ++r) ZS_RETURN_IF_ERROR(round_trip());
      one_way = SecondsSince(t0) / reps / 2;
    }
    ZS_RETURN_IF_ERROR(comm.Broadcast(&one_way, 1, DType::kFloat64, a).Wait());
    xs.push_back(static_cast<double>(size));
    ys.push_back(one_way);
  }
  CollectiveFit fit = FitAlphaBeta(xs, ys);
  fit.alpha_s = std::max(0.0, ys.front() - xs.front() / fit.beta_bytes_per_s);
  return fit;
}

}  // namespace zeroshard::tools
