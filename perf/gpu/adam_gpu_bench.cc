// Bandwidth of the fused CUDA AdamW (kernels/cuda/adam.cuh) against a
// device-to-device cudaMemcpy of the same bytes, in the same run.
//
// Definitions (so the ratio is honest):
//  - "bytes" of an update = the fewest bytes it must move through device
//    memory, each input read once and each output written once:
//      fp32:                   p r+w 8 + g r 4 + m r+w 8 + v r+w 8      = 28 B/param
//      bf16-mixed, bf16 grads: master r+w 8 + grad r 2 + m r+w 8
//                              + v r+w 8 + param_out w 2                 = 28 B/param
//  - the copy baseline for B bytes is one cudaMemcpyDeviceToDevice of B/2
//    bytes, so that its bytes read + written also equal B;
//  - GB/s = B / kernel time (1e9 bytes per GB), times from CUDA events around
//    each launch on one stream.
// After a warm-up, copy and update alternate (copy, update, copy, ...)
// --repeats times; each pair gives one ratio t_copy / t_update, so both
// halves of a pair see the same clocks and temperature. The table prints the
// median GB/s of each and the median ratio (with the range).
//
// Before timing, one update of the whole buffer is checked bit for bit
// against the CPU kernel (kernels/cpu/adam.h, the same numeric contract) on
// its first and last kCheckElems elements, and every bf16 param must have
// been written: a fast wrong kernel fails.
//
// Exit codes: 0 all ratios >= --min-ratio; 1 a ratio below it, a CUDA error
// or a wrong result; 2 bad arguments; 77 no CUDA device (ctest's skip code).
// --json FILE writes the figures.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "examples/common/median.h"
#include "kernels/common/adam_constants.h"
#include "kernels/common/float16_rules.h"
#include "kernels/cpu/adam.h"
#include "kernels/cuda/adam.cuh"
#include "perf/bench_main.h"

namespace zeroshard::kernels::cuda {
namespace {

constexpr int kExitNoDevice = 77;
constexpr size_t kCheckElems = size_t{1} << 20;
// The bf16 params' initial bits: a NaN, so an element the kernel never
// writes shows up.
constexpr uint16_t kPoison = 0x7fc1;

struct Options {
  size_t params = size_t{256} << 20;
  int warmup = 3;
  int repeats = 20;
  double min_ratio = 0.9;
  std::string precision = "all";  // fp32 | bf16 | all
  std::string json_path;
};

void Usage() {
  std::printf(
      "usage: adam_gpu_bench [--params N[K|M|G]] [--warmup W] [--repeats R]\n"
      "                      [--precision fp32|bf16|all] [--min-ratio X] [--json FILE]\n"
      "  --params     parameters per update (default 256M; K/M/G are powers of 2)\n"
      "  --min-ratio  fail (exit 1) when AdamW GB/s / copy GB/s is below X (default "
      "0.9)\n");
}

absl::StatusOr<Options> ParseOptions(int argc, char** argv, bool* help) {
  Options o;
  int64_t params = static_cast<int64_t>(o.params);
  const std::vector<std::string> precisions = {"fp32", "bf16", "all"};
  int precision = 2;
  cli::FlagSet flags;
  // A count written as a size: "1M" is 2^20 parameters.
  flags.Size("params", &params, 1, int64_t{1} << 40)
      .Int("warmup", &o.warmup, 0, cli::kMaxCount)
      .Int("repeats", &o.repeats, 1, cli::kMaxCount)
      .Number("min-ratio", &o.min_ratio, 0, 1e6)
      .Choice("precision", precisions, &precision)
      .String("json", &o.json_path);
  if (absl::Status s = flags.Parse(argc, argv, help); !s.ok()) return s;
  o.params = static_cast<size_t>(params);
  o.precision = precisions[precision];
  return o;
}

// Every CUDA call goes through here: a failure ends the run with the call,
// the error's name and text.
void Check(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return;
  std::fprintf(stderr, "adam_gpu_bench: %s failed: %s (%s)\n", call, cudaGetErrorName(rc),
               cudaGetErrorString(rc));
  std::exit(1);
}

template <class T>
T* DeviceAlloc(size_t n, const char* what) {
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, n * sizeof(T));
  if (rc != cudaSuccess) {
    std::fprintf(stderr,
                 "adam_gpu_bench: cudaMalloc of %zu bytes for %s failed: %s; lower --params\n",
                 n * sizeof(T), what, cudaGetErrorString(rc));
    std::exit(1);
  }
  return static_cast<T*>(p);
}

// The optimizer state of one run: fp32 p/master, g, m, v and the bf16 grads
// and param copy (never freed: the process is short); random normal magnitudes (never zeros: they
// can run faster than real data and hide unwritten outputs), filled from the host in chunks.
struct State {
  size_t n = 0;
  float *p = nullptr, *g = nullptr, *m = nullptr, *v = nullptr;
  uint16_t *g16 = nullptr, *out = nullptr;
};

State MakeState(size_t n, bool need_bf16) {
  State s;
  s.n = n;
  s.p = DeviceAlloc<float>(n, "params");
  s.g = DeviceAlloc<float>(n, "fp32 grads");
  s.m = DeviceAlloc<float>(n, "m");
  s.v = DeviceAlloc<float>(n, "v");
  if (need_bf16) {
    s.g16 = DeviceAlloc<uint16_t>(n, "bf16 grads");
    s.out = DeviceAlloc<uint16_t>(n, "bf16 params");
  }
  constexpr size_t kChunk = size_t{16} << 20;
  std::vector<float> p(kChunk), g(kChunk), m(kChunk), v(kChunk);
  std::vector<uint16_t> g16(kChunk), out(kChunk);
  uint32_t state = 12345;
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t len = std::min(kChunk, n - begin);
    for (size_t i = 0; i < len; ++i) {
      state = state * 1664525u + 1013904223u;
      const float r = static_cast<float>(state >> 8) * (1.0f / 16777216.0f) - 0.5f;  // [-.5,.5)
      p[i] = 0.05f * r;
      g[i] = 1e-3f * r + 1e-6f;
      m[i] = 1e-4f * r;
      v[i] = 1e-8f * (r * r + 0.01f);
      g16[i] = Fp32ToBf16Rne(g[i]);
      out[i] = kPoison;
    }
    const size_t bytes = len * sizeof(float);
    Check(cudaMemcpy(s.p + begin, p.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy p");
    Check(cudaMemcpy(s.g + begin, g.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy g");
    Check(cudaMemcpy(s.m + begin, m.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy m");
    Check(cudaMemcpy(s.v + begin, v.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy v");
    if (need_bf16) {
      const size_t half = len * sizeof(uint16_t);
      Check(cudaMemcpy(s.g16 + begin, g16.data(), half, cudaMemcpyHostToDevice),
            "cudaMemcpy bf16 grads");
      Check(cudaMemcpy(s.out + begin, out.data(), half, cudaMemcpyHostToDevice),
            "cudaMemcpy bf16 params");
    }
  }
  return s;
}

// One benchmarked variant: its name, bytes per param and its launch.
struct Variant {
  const char* name;
  const char* bytes_formula;
  int bytes_per_param;
  bool bf16;
};

const Variant kFp32 = {"adamw fp32", "p r+w 8 + g r 4 + m r+w 8 + v r+w 8", 28, false};
const Variant kBf16 = {"adamw bf16-mixed bf16-grad",
                       "master r+w 8 + grad r 2 + m r+w 8 + v r+w 8 + param w 2", 28, true};

cudaError_t Launch(const Variant& variant, State& s, const AdamConstants& c, cudaStream_t stream) {
  if (variant.bf16) {
    return LaunchAdam(s.p, s.out, nullptr, s.g16, s.m, s.v, s.n, c, stream);
  }
  return LaunchAdam(s.p, nullptr, s.g, nullptr, s.m, s.v, s.n, c, stream);
}

template <class T>
std::vector<T> CopyBack(const T* device, size_t offset, size_t len) {
  std::vector<T> host(len);
  Check(cudaMemcpy(host.data(), device + offset, len * sizeof(T), cudaMemcpyDeviceToHost),
        "cudaMemcpy to host");
  return host;
}

// One update of the whole buffer, compared on [offset, offset + len) with
// the CPU kernel on the same inputs. Returns false (and says where) on the
// first element whose bits differ.
bool CheckOneUpdate(const Variant& variant, State& s, const AdamConstants& c, size_t offset,
                    size_t len) {
  std::vector<float> p = CopyBack(s.p, offset, len);
  std::vector<float> m = CopyBack(s.m, offset, len);
  std::vector<float> v = CopyBack(s.v, offset, len);
  std::vector<float> g = CopyBack(s.g, offset, len);
  std::vector<uint16_t> g16, out(len, 0);
  if (variant.bf16) g16 = CopyBack(s.g16, offset, len);
  Check(Launch(variant, s, c, nullptr), "LaunchAdam (check)");
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after LaunchAdam (check)");
  if (variant.bf16) {
    AdamMixedBf16GradBf16(p.data(), out.data(), g16.data(), m.data(), v.data(), len, c);
  } else {
    AdamFp32(p.data(), g.data(), m.data(), v.data(), len, c);
  }
  const std::vector<float> gpu_p = CopyBack(s.p, offset, len);
  const std::vector<float> gpu_m = CopyBack(s.m, offset, len);
  const std::vector<float> gpu_v = CopyBack(s.v, offset, len);
  std::vector<uint16_t> gpu_out;
  if (variant.bf16) gpu_out = CopyBack(s.out, offset, len);
  for (size_t i = 0; i < len; ++i) {
    const bool same = std::memcmp(&p[i], &gpu_p[i], sizeof(float)) == 0 &&
                      std::memcmp(&m[i], &gpu_m[i], sizeof(float)) == 0 &&
                      std::memcmp(&v[i], &gpu_v[i], sizeof(float)) == 0 &&
                      (!variant.bf16 || out[i] == gpu_out[i]);
    if (!same) {
      std::fprintf(stderr,
                   "adam_gpu_bench: %s: element %zu differs from the CPU kernel "
                   "(p %.9g vs %.9g, m %.9g vs %.9g, v %.9g vs %.9g); the CUDA kernel is wrong, "
                   "run kernels_cuda_adam_test\n",
                   variant.name, offset + i, gpu_p[i], p[i], gpu_m[i], m[i], gpu_v[i], v[i]);
      return false;
    }
  }
  return true;
}

// After an update every bf16 param must have been written: none may still
// hold MakeState's poison (a NaN no finite update produces).
bool EveryParamWritten(const State& s) {
  constexpr size_t kChunk = size_t{32} << 20;
  for (size_t begin = 0; begin < s.n; begin += kChunk) {
    const size_t len = std::min(kChunk, s.n - begin);
    const std::vector<uint16_t> out = CopyBack(s.out, begin, len);
    const auto hit = std::find(out.begin(), out.end(), kPoison);
    if (hit != out.end()) {
      std::fprintf(stderr,
                   "adam_gpu_bench: bf16 param %zu was never written by the update; the CUDA "
                   "kernel misses elements, run kernels_cuda_adam_test\n",
                   begin + static_cast<size_t>(hit - out.begin()));
      return false;
    }
  }
  return true;
}

struct Result {
  const Variant* variant;
  size_t params;
  double bytes;
  double adam_gbps, copy_gbps;  // medians
  double ratio, ratio_min, ratio_max;
  double adam_ms, copy_ms;  // medians
  bool passed;
};

// AdamW with weight decay, a few steps in: every term of the update is live.
AdamConstants BenchConstants() {
  AdamStepParams params;
  params.weight_decay = 0.01;
  params.step = 10;
  return MakeAdamConstants(params);
}

Result Measure(const Variant& variant, State& s, char* copy_src, char* copy_dst, const Options& o) {
  const AdamConstants c = BenchConstants();
  const double bytes = static_cast<double>(variant.bytes_per_param) * static_cast<double>(s.n);
  const size_t copy_bytes = static_cast<size_t>(variant.bytes_per_param) / 2 * s.n;

  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  auto time_ms = [&](auto&& work, const char* what) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    Check(work(), what);
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), what);
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return static_cast<double>(ms);
  };
  auto copy = [&] {
    return cudaMemcpyAsync(copy_dst, copy_src, copy_bytes, cudaMemcpyDeviceToDevice, stream);
  };
  auto update = [&] { return Launch(variant, s, c, stream); };

  for (int i = 0; i < o.warmup; ++i) {
    time_ms(copy, "cudaMemcpyAsync (warm-up)");
    time_ms(update, "LaunchAdam (warm-up)");
  }
  std::vector<double> adam_ms, copy_ms, ratios;
  for (int i = 0; i < o.repeats; ++i) {
    const double t_copy = time_ms(copy, "cudaMemcpyAsync device to device");
    const double t_adam = time_ms(update, "LaunchAdam");
    copy_ms.push_back(t_copy);
    adam_ms.push_back(t_adam);
    ratios.push_back(t_copy / t_adam);  // same bytes: the bandwidth ratio
  }
  Check(cudaEventDestroy(start), "cudaEventDestroy");
  Check(cudaEventDestroy(stop), "cudaEventDestroy");
  Check(cudaStreamDestroy(stream), "cudaStreamDestroy");

  Result r;
  r.variant = &variant;
  r.params = s.n;
  r.bytes = bytes;
  r.adam_ms = examples::Median(adam_ms);
  r.copy_ms = examples::Median(copy_ms);
  r.adam_gbps = bytes / (r.adam_ms * 1e-3) / 1e9;
  r.copy_gbps = bytes / (r.copy_ms * 1e-3) / 1e9;
  r.ratio = examples::Median(ratios);
  r.ratio_min = *std::min_element(ratios.begin(), ratios.end());
  r.ratio_max = *std::max_element(ratios.begin(), ratios.end());
  r.passed = r.ratio >= o.min_ratio;
  return r;
}

bool WriteJson(const std::string& path, const std::string& device, const Options& o,
               const std::vector<Result>& results) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "adam_gpu_bench: cannot write --json %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return false;
  }
  std::fprintf(f, "{\n  \"bench\": \"adam_gpu_bench\",\n  \"device\": \"%s\",\n", device.c_str());
  std::fprintf(f, "  \"params\": %zu,\n  \"warmup\": %d,\n  \"repeats\": %d,\n", o.params, o.warmup,
               o.repeats);
  std::fprintf(f, "  \"min_ratio\": %.3f,\n  \"results\": [\n", o.min_ratio);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(f,
                 "    {\"variant\": \"%s\", \"bytes_per_param\": %d, \"bytes\": %.0f, "
                 "\"adam_ms\": %.6f, \"copy_ms\": %.6f, \"adam_gbps\": %.2f, "
                 "\"copy_gbps\": %.2f, \"ratio\": %.4f, \"ratio_min\": %.4f, "
                 "\"ratio_max\": %.4f, \"passed\": %s}%s\n",
                 r.variant->name, r.variant->bytes_per_param, r.bytes, r.adam_ms, r.copy_ms,
                 r.adam_gbps, r.copy_gbps, r.ratio, r.ratio_min, r.ratio_max,
                 r.passed ? "true" : "false", i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  return std::fclose(f) == 0;
}

int Run(const Options& o) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    std::printf("adam_gpu_bench: no CUDA device (cudaGetDeviceCount: %s); nothing measured\n",
                rc == cudaSuccess ? "0 devices" : cudaGetErrorString(rc));
    return kExitNoDevice;
  }
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  Check(cudaSetDevice(0), "cudaSetDevice");

  std::vector<const Variant*> variants;
  if (o.precision != "bf16") variants.push_back(&kFp32);
  if (o.precision != "fp32") variants.push_back(&kBf16);
  const bool need_bf16 = o.precision != "fp32";

  // The copy moves 28/2 bytes per param each way; one pair of buffers serves
  // both variants (28 B/param each).
  const size_t copy_bytes = size_t{14} * o.params;
  const size_t state_bytes = o.params * (16 + (need_bf16 ? 4 : 0));
  size_t free_bytes = 0, total_bytes = 0;
  Check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (state_bytes + 2 * copy_bytes > free_bytes) {
    std::fprintf(stderr,
                 "adam_gpu_bench: --params %zu needs %.2f GiB of GPU memory, %.2f GiB free on "
                 "%s; lower --params\n",
                 o.params, (state_bytes + 2 * copy_bytes) / 1073741824.0, free_bytes / 1073741824.0,
                 prop.name);
    return 1;
  }
  State s = MakeState(o.params, need_bf16);
  char* copy_src = DeviceAlloc<char>(copy_bytes, "copy source");
  char* copy_dst = DeviceAlloc<char>(copy_bytes, "copy destination");
  Check(cudaMemset(copy_src, 0x3c, copy_bytes), "cudaMemset copy source");
  Check(cudaMemset(copy_dst, 0, copy_bytes), "cudaMemset copy destination");

  std::printf("adam_gpu_bench: %s (sm_%d%d, %d SMs), %zu params (%.2f GiB of state)\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, o.params,
              state_bytes / 1073741824.0);
  std::vector<Result> results;
  bool correct = true;
  for (const Variant* variant : variants) {
    std::printf("  %s: %d B/param = %s\n", variant->name, variant->bytes_per_param,
                variant->bytes_formula);
    const size_t len = std::min(kCheckElems, o.params);
    // The check's one update is also the first warm-up launch.
    correct = CheckOneUpdate(*variant, s, BenchConstants(), 0, len) &&
              CheckOneUpdate(*variant, s, BenchConstants(), o.params - len, len) &&
              (!variant->bf16 || EveryParamWritten(s)) && correct;
    results.push_back(Measure(*variant, s, copy_src, copy_dst, o));
  }

  std::printf(
      "\nAdamW vs device-to-device cudaMemcpy of the same bytes (copy GB/s counts read + "
      "write);\nmedians of %d pairs after %d warm-up pairs; ratio = copy time / AdamW time\n",
      o.repeats, o.warmup);
  std::printf("%-28s %6s %9s %9s %10s %10s %7s %15s  %s\n", "variant", "B/par", "adam ms",
              "copy ms", "adam GB/s", "copy GB/s", "ratio", "ratio range", "verdict");
  bool passed = correct;
  for (const Result& r : results) {
    std::printf("%-28s %6d %9.3f %9.3f %10.1f %10.1f %7.3f %7.3f..%-6.3f  %s\n", r.variant->name,
                r.variant->bytes_per_param, r.adam_ms, r.copy_ms, r.adam_gbps, r.copy_gbps, r.ratio,
                r.ratio_min, r.ratio_max, r.passed ? "ok" : "BELOW --min-ratio");
    passed = passed && r.passed;
  }
  if (!o.json_path.empty() && !WriteJson(o.json_path, prop.name, o, results)) return 1;
  if (!correct) {
    std::printf("adam_gpu_bench: FAILED: a result differs from the CPU kernel (see above)\n");
    return 1;
  }
  if (!passed) {
    std::printf("adam_gpu_bench: FAILED: AdamW reaches under %.2f of the copy's bandwidth\n",
                o.min_ratio);
    return 1;
  }
  std::printf("adam_gpu_bench: passed (every ratio >= %.2f)\n", o.min_ratio);
  return 0;
}

}  // namespace
}  // namespace zeroshard::kernels::cuda

int main(int argc, char** argv) {
  namespace bench = zeroshard::kernels::cuda;
  return zeroshard::perf::BenchMain<bench::Options>("adam_gpu_bench", argc, argv,
                                                    bench::ParseOptions, bench::Usage, bench::Run);
}
