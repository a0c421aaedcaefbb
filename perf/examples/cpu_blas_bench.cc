// cpu_blas_bench: the sgemm kernel path the example trainers run
// (examples/common/cpu_blas.h, SetUpCpuBlas) against every other path this
// machine has, at 2048^3 and at the trainers' shapes, one thread, fp32; and
// against the CPU's single-core FMA peak, measured by an FMA loop of the
// CPU's widest vectors in the same run.
//
//   build/perf/examples/cpu_blas_bench [--rounds 5] [--min-ms 40]
//       [--cores Haswell,Zen,SkylakeX,Cooperlake,Prescott]
//       [--blis /usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4]
//       [--dnnl /usr/lib/x86_64-linux-gnu/libdnnl.so.2]
//
// Candidates: the path SetUpCpuBlas chose ("zeroshard"); OpenBLAS forced to
// each of --cores (switched in this process, as SetUpCpuBlas switches);
// BLIS's cblas_sgemm and oneDNN's dnnl_sgemm when their libraries load
// (Debian's libblis4-pthread and libdnnl2; default: tried by soname, skipped
// when absent). With AVX512-BF16 and oneDNN, dnnl_gemm_bf16bf16f32 (bf16
// inputs, fp32 accumulation and output) is printed beside, not compared:
// the trainers' fp32 products cannot use it.
//
// Each figure is the median over --rounds rounds of GFLOP/s in thread CPU
// time (a loaded machine steals wall time, not thread time); in a round
// every candidate runs each shape for at least --min-ms, in turn, so that a
// neighbour's load falls on all of them alike. The ratio is zeroshard's over
// the best candidate's (the acceptance of issue 20: >= 0.7).
#include <cblas.h>
#include <dlfcn.h>
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "examples/common/cpu_blas.h"
#include "examples/common/median.h"
#include "perf/bench_main.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

struct BenchOptions {
  int rounds = 5;
  int min_ms = 40;
  std::string cores = "Haswell,Zen,SkylakeX,Cooperlake,Prescott";
  std::string blis = "libblis.so.4";
  std::string dnnl = "libdnnl.so.2";
};

// C[m,n] = op(A) op(B), row-major, op = transpose where the flag says.
struct Shape {
  const char* name;
  int m, n, k;
  bool trans_a, trans_b;
  double Flop() const { return 2.0 * m * n * k; }
};

// The trainers' products. MLP demo (hidden 512, inner 2048, micro-batch 32):
// the forward x W^T, the input gradient dY W, the weight gradient dY^T X.
// GPT (rows N = batch x seq, width C): the fused QKV [N,C]x[C,3C], the MLP's
// [N,C]x[C,4C] and [N,4C]x[4C,C], the byte-level head [N,C]x[256,C]^T, and
// a weight gradient [N,C]^T [N,3C], at N 512 / C 128 (the test model),
// N 1024 / C 768 (GPT-2 small's width) and N 2048 / C 384; and the
// attention's products per head and chunk of 64 query rows (S = Q K^T over
// the keys so far, then S V) at the last chunk of a sequence: head dim 32,
// seq 128 (gpt2-4l-128) and head dim 64, seq 256 (gpt2-6l-384). The
// trainers read Q, K, V in place with a row stride of 3C; here they are
// contiguous.
const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {
      {"square 2048^3", 2048, 2048, 2048, false, false},
      {"mlp fc1 fwd", 32, 2048, 512, false, true},
      {"mlp fc2 fwd", 32, 512, 2048, false, true},
      {"mlp fc2 dX", 32, 2048, 512, false, false},
      {"mlp fc1 dW", 2048, 512, 32, true, false},
      {"gpt C128 qkv", 512, 384, 128, false, false},
      {"gpt C128 fc", 512, 512, 128, false, false},
      {"gpt C128 proj", 512, 128, 512, false, false},
      {"gpt C128 head", 512, 256, 128, false, true},
      {"gpt C128 qkv dW", 128, 384, 512, true, false},
      {"gpt C768 qkv", 1024, 2304, 768, false, false},
      {"gpt C768 fc", 1024, 3072, 768, false, false},
      {"gpt C768 proj", 1024, 768, 3072, false, false},
      {"gpt C768 head", 1024, 256, 768, false, true},
      {"gpt C768 qkv dW", 768, 2304, 1024, true, false},
      {"gpt C384 N2048 qkv", 2048, 1152, 384, false, false},
      {"gpt attn QK^T D32", 64, 128, 32, false, true},
      {"gpt attn PV D32", 64, 32, 128, false, false},
      {"gpt attn QK^T D64", 64, 256, 64, false, true},
      {"gpt attn PV D64", 64, 64, 256, false, false},
  };
  return shapes;
}

double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// The operands of one shape, fresh random values.
struct Operands {
  std::vector<float> a, b, c;
  std::vector<uint16_t> a16, b16;  // bf16 (truncated) copies for the bf16 line
  explicit Operands(const Shape& s, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    a.resize(static_cast<size_t>(s.m) * s.k);
    b.resize(static_cast<size_t>(s.k) * s.n);
    c.resize(static_cast<size_t>(s.m) * s.n);
    for (float& v : a) v = u(rng);
    for (float& v : b) v = u(rng);
    a16.resize(a.size());
    b16.resize(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = Bf16Bits(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b16[i] = Bf16Bits(b[i]);
  }
  static uint16_t Bf16Bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>(u >> 16);
  }
};

using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, int, int, int, float,
                         const float*, int, const float*, int, float, float*, int);
using DnnlSgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                            const float*, int64_t, float, float*, int64_t);
using DnnlBf16Fn = int (*)(char, char, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
                           const uint16_t*, int64_t, float, float*, int64_t);

struct Candidate {
  std::string name;
  std::function<void()> select;  // makes this path current (an OpenBLAS core)
  std::function<void(const Shape&, Operands&)> run;
  bool compared = true;  // false: printed beside (bf16)
};

void RunCblas(SgemmFn fn, const Shape& s, Operands& o) {
  fn(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
     s.m, s.n, s.k, 1.0f, o.a.data(), s.trans_a ? s.m : s.k, o.b.data(), s.trans_b ? s.k : s.n,
     0.0f, o.c.data(), s.n);
}

// GFLOP/s of `c` at `s`: repeats until min_ms of thread time have passed.
double Measure(const Candidate& c, const Shape& s, Operands& o, int min_ms) {
  c.run(s, o);  // first touch, packing buffers
  int reps = 0;
  const double start = ThreadSeconds();
  double elapsed = 0.0;
  do {
    c.run(s, o);
    ++reps;
    elapsed = ThreadSeconds() - start;
  } while (elapsed * 1e3 < min_ms);
  return s.Flop() * reps / elapsed * 1e-9;
}

// The CPU's single-core fp32 FMA peak: 12 independent FMA chains of the
// widest vectors (enough to cover the latency of two FMA pipes), in thread
// time; the best of 5.
__attribute__((target("avx512f"))) double FmaLoop512(int64_t iters) {
  __m512 acc[12];
  const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const double start = ThreadSeconds();
  for (int64_t k = 0; k < iters; ++k) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], mul, add);
  }
  const double sec = ThreadSeconds() - start;
  float lanes[16];
  float sink = 0.0f;
  for (int i = 0; i < 12; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    for (float v : lanes) sink += v;
  }
  if (sink == 1.25f) std::printf(" ");  // keeps the chains alive
  return iters * 12.0 * 16 * 2 / sec * 1e-9;
}

__attribute__((target("avx2,fma"))) double FmaLoop256(int64_t iters) {
  __m256 acc[12];
  const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const double start = ThreadSeconds();
  for (int64_t k = 0; k < iters; ++k) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], mul, add);
  }
  const double sec = ThreadSeconds() - start;
  float lanes[8];
  float sink = 0.0f;
  for (int i = 0; i < 12; ++i) {
    _mm256_storeu_ps(lanes, acc[i]);
    for (float v : lanes) sink += v;
  }
  if (sink == 1.25f) std::printf(" ");
  return iters * 12.0 * 8 * 2 / sec * 1e-9;
}

double FmaPeak(examples::KernelIsa isa) {
  double best = 0.0;
  for (int i = 0; i < 5; ++i) {
    if (isa == examples::KernelIsa::kAvx512) {
      best = std::max(best, FmaLoop512(20'000'000));
    } else if (isa == examples::KernelIsa::kAvx2) {
      best = std::max(best, FmaLoop256(20'000'000));
    }
  }
  return best;
}

std::vector<Candidate> MakeCandidates(const BenchOptions& opts) {
  std::vector<Candidate> out;
  const std::string chosen = examples::SetUpCpuBlas().core;
  out.push_back({absl::StrCat("zeroshard (", chosen, ")"),
                 [chosen] { (void)examples::SwitchOpenBlasCore(chosen); },
                 [](const Shape& s, Operands& o) { RunCblas(&cblas_sgemm, s, o); }});
  for (absl::string_view core : absl::StrSplit(opts.cores, ',', absl::SkipEmpty())) {
    const std::string name(core);
    absl::StatusOr<std::string> got = examples::SwitchOpenBlasCore(name);
    if (!got.ok() || !absl::EqualsIgnoreCase(*got, name)) {
      std::printf("  (OpenBLAS core %s: not available here, runs %s)\n", name.c_str(),
                  got.ok() ? got->c_str() : std::string(got.status().message()).c_str());
      continue;
    }
    out.push_back({absl::StrCat("OpenBLAS ", name),
                   [name] { (void)examples::SwitchOpenBlasCore(name); },
                   [](const Shape& s, Operands& o) { RunCblas(&cblas_sgemm, s, o); }});
  }
  (void)examples::SwitchOpenBlasCore(chosen);
  // BLIS also exports cblas_sgemm: DEEPBIND makes its calls bind to its own
  // symbols before OpenBLAS's, which the executable brought in first.
  if (void* h = dlopen(opts.blis.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)) {
    auto threads = reinterpret_cast<void (*)(int64_t)>(dlsym(h, "bli_thread_set_num_threads"));
    auto arch_id = reinterpret_cast<int (*)()>(dlsym(h, "bli_arch_query_id"));
    auto arch_name = reinterpret_cast<const char* (*)(int)>(dlsym(h, "bli_arch_string"));
    auto version = reinterpret_cast<const char* (*)()>(dlsym(h, "bli_info_get_version_str"));
    auto fn = reinterpret_cast<SgemmFn>(dlsym(h, "cblas_sgemm"));
    if (fn != nullptr && threads != nullptr) {
      threads(1);
      const std::string name =
          absl::StrCat("BLIS ", version != nullptr ? version() : "?", " ",
                       arch_id != nullptr && arch_name != nullptr ? arch_name(arch_id()) : "");
      out.push_back({name, [] {}, [fn](const Shape& s, Operands& o) { RunCblas(fn, s, o); }});
    }
  } else {
    std::printf("  (BLIS: %s does not load: %s)\n", opts.blis.c_str(), dlerror());
  }
  if (void* h = dlopen(opts.dnnl.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    // Debian's oneDNN runs on OpenMP: one thread, as the trainers run.
    if (auto omp = reinterpret_cast<void (*)(int)>(dlsym(h, "omp_set_num_threads"))) omp(1);
    auto sgemm = reinterpret_cast<DnnlSgemmFn>(dlsym(h, "dnnl_sgemm"));
    auto bf16 = reinterpret_cast<DnnlBf16Fn>(dlsym(h, "dnnl_gemm_bf16bf16f32"));
    if (sgemm != nullptr) {
      out.push_back({"oneDNN sgemm", [] {},
                     [sgemm](const Shape& s, Operands& o) {
                       sgemm(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f,
                             o.a.data(), s.trans_a ? s.m : s.k, o.b.data(), s.trans_b ? s.k : s.n,
                             0.0f, o.c.data(), s.n);
                     }});
    }
    if (bf16 != nullptr && examples::HostCpuFeatures().avx512_bf16) {
      out.push_back({"oneDNN bf16 (beside)", [] {},
                     [bf16](const Shape& s, Operands& o) {
                       bf16(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f,
                            o.a16.data(), s.trans_a ? s.m : s.k, o.b16.data(),
                            s.trans_b ? s.k : s.n, 0.0f, o.c.data(), s.n);
                     },
                     false});
    }
  } else {
    std::printf("  (oneDNN: %s does not load: %s)\n", opts.dnnl.c_str(), dlerror());
  }
  return out;
}

int Run(const BenchOptions& opts) {
  examples::SetUpCpuBlas();
  std::printf(
      "cpu_blas_bench: sgemm, 1 thread, fp32, GFLOP/s in thread CPU time, median of %d "
      "interleaved rounds\n",
      opts.rounds);
  std::printf("BLAS: %s\n", examples::CpuBlasDescription().c_str());
  const examples::KernelIsa isa = examples::BestKernelIsa(examples::HostCpuFeatures());
  const double peak = FmaPeak(isa);
  std::printf("FMA peak (1 core, %s FMA loop): %.1f GFLOP/s\n",
              std::string(examples::KernelIsaName(isa)).c_str(), peak);
  std::vector<Candidate> cands = MakeCandidates(opts);
  const std::vector<Shape>& shapes = Shapes();
  std::mt19937 rng(std::random_device{}());
  std::vector<Operands> operands;
  for (const Shape& s : shapes) operands.emplace_back(s, rng);
  // gflops[shape][candidate][round]
  std::vector<std::vector<std::vector<double>>> gflops(
      shapes.size(), std::vector<std::vector<double>>(cands.size()));
  for (int r = 0; r < opts.rounds; ++r) {
    for (size_t c = 0; c < cands.size(); ++c) {
      cands[c].select();
      for (size_t s = 0; s < shapes.size(); ++s) {
        gflops[s][c].push_back(Measure(cands[c], shapes[s], operands[s], opts.min_ms));
      }
    }
  }
  cands[0].select();
  std::printf("\n%-20s %-17s %10s %10s %-22s %6s %8s\n", "shape", "M x N x K (op)", "zeroshard",
              "best", "(best path)", "ratio", "of peak");
  int met = 0;
  for (size_t s = 0; s < shapes.size(); ++s) {
    const Shape& sh = shapes[s];
    const double ours = examples::Median(gflops[s][0]);
    size_t best = 0;
    for (size_t c = 0; c < cands.size(); ++c) {
      if (cands[c].compared && examples::Median(gflops[s][c]) > examples::Median(gflops[s][best])) {
        best = c;
      }
    }
    const double top = examples::Median(gflops[s][best]);
    const double ratio = ours / top;
    met += ratio >= 0.7;
    const std::string dims = absl::StrCat(sh.m, "x", sh.n, "x", sh.k, " ", sh.trans_a ? "T" : "N",
                                          sh.trans_b ? "T" : "N");
    std::printf("%-20s %-17s %10.1f %10.1f %-22s %6.2f %7.1f%%\n", sh.name, dims.c_str(), ours, top,
                cands[best].name.c_str(), ratio, peak > 0 ? 100.0 * ours / peak : 0.0);
  }
  std::printf("zeroshard's path >= 0.7x the best measured path at %d of %zu shapes\n", met,
              shapes.size());
  std::printf("\nevery path (GFLOP/s, median):\n%-20s", "shape");
  for (const Candidate& c : cands) std::printf(" %14.14s", c.name.c_str());
  std::printf("\n");
  for (size_t s = 0; s < shapes.size(); ++s) {
    std::printf("%-20s", shapes[s].name);
    for (size_t c = 0; c < cands.size(); ++c) {
      std::printf(" %14.1f", examples::Median(gflops[s][c]));
    }
    std::printf("\n");
  }
  return 0;
}

absl::StatusOr<BenchOptions> ParseOptions(int argc, char** argv, bool* help) {
  BenchOptions opts;
  cli::FlagSet flags;
  flags.Int("rounds", &opts.rounds, 1, cli::kMaxCount)
      .Int("min-ms", &opts.min_ms, 1, 100000)
      .String("cores", &opts.cores)
      .String("blis", &opts.blis)
      .String("dnnl", &opts.dnnl);
  ZS_RETURN_IF_ERROR(flags.Parse(argc, argv, help));
  return opts;
}

void PrintUsage() {
  std::printf(
      "usage: cpu_blas_bench [--rounds 5] [--min-ms 40]\n"
      "                      [--cores Haswell,Zen,SkylakeX,Cooperlake,Prescott]\n"
      "                      [--blis libblis.so.4] [--dnnl libdnnl.so.2]\n"
      "The sgemm path the example trainers run (examples/common/cpu_blas.h) against\n"
      "OpenBLAS's other cores, BLIS and oneDNN when they load, at 2048^3 and the\n"
      "trainers' shapes, 1 thread, fp32: GFLOP/s, the ratio to the best, the share of\n"
      "the measured single-core FMA peak.\n");
}

}  // namespace
}  // namespace zeroshard

int main(int argc, char** argv) {
  return zeroshard::perf::BenchMain<zeroshard::BenchOptions>(
      "cpu_blas_bench", argc, argv, zeroshard::ParseOptions, zeroshard::PrintUsage, zeroshard::Run);
}
