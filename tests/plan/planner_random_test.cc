// Random models and clusters whose sizes multiply past 2^63: the planner
// either refuses them with a one-line InvalidArgument, or every number it
// reports is exact (params against a 128-bit count written here, from the
// config's fields) or finite and non-negative. A fresh seed each run;
// ZS_TEST_SEED replays one.
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_seed.h"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/estimate/planner.h"
#include "zeroshard/estimate/report.h"

namespace zeroshard {
namespace {

using U128 = unsigned __int128;
using nlohmann::json;

// Saturates at 2^120, far above anything the planner accepts (2^56).
constexpr U128 kSaturated = U128{1} << 120;
U128 Mul(U128 a, U128 b) { return a != 0 && b > kSaturated / a ? kSaturated : a * b; }
U128 Add(U128 a, U128 b) { return a + b > kSaturated ? kSaturated : a + b; }
U128 Mul(std::initializer_list<U128> xs) {
  U128 p = 1;
  for (U128 x : xs) p = Mul(p, x);
  return p;
}

class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}

  // Log-uniform in [1, 2^max_bits): most draws are small, some pass 2^63
  // once multiplied.
  int64_t LogUniform(int max_bits) {
    const double e = std::uniform_real_distribution<double>(0.0, max_bits)(rng_);
    const double v = std::floor(std::exp2(e));
    return v >= 9.2e18 ? int64_t{1} << 62 : std::max<int64_t>(1, static_cast<int64_t>(v));
  }
  // A random ceiling for one case's dimensions, up to 2^63.
  int Bits() { return Int(1, 63); }
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng_); }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(Int(0, static_cast<int>(v.size()) - 1))];
  }

 private:
  std::mt19937_64 rng_;
};

struct RandomModel {
  std::string text;
  bool hf = false;
  U128 params = 0;  // the independent count
};

// A config.json of one of the supported architectures, and its count the
// way Hugging Face builds the model.
RandomModel RandomHfConfig(Draw& d) {
  const std::string arch =
      d.Pick<std::string>({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "MixtralForCausalLM", "GPT2LMHeadModel"});
  const int bits = d.Bits();
  json c;
  c["architectures"] = {arch};
  int64_t h = d.LogUniform(bits);
  const int64_t layers = d.Coin(0.8) ? d.LogUniform(std::min(bits, 15)) : d.LogUniform(bits);
  const int64_t heads = d.Coin(0.7) ? int64_t{1} << d.Int(0, 6) : d.LogUniform(bits);
  int64_t vocab = d.LogUniform(bits);
  if (arch != "GPT2LMHeadModel" && d.Coin(0.1)) {
    // vocab x hidden = 2^64 + m 2^j: the embedding wraps to a small count.
    const int j = d.Int(6, 20);
    h = int64_t{1} << j;
    vocab = (int64_t{1} << (64 - j)) + d.LogUniform(10);
  }
  RandomModel m;
  m.hf = true;
  if (arch == "GPT2LMHeadModel") {
    // n_embd a multiple of n_head, mostly.
    const int64_t hidden = d.Coin(0.8) && h <= (int64_t{1} << 62) / heads ? h * heads : h;
    c["n_embd"] = hidden;
    c["n_layer"] = layers;
    c["n_head"] = heads;
    c["vocab_size"] = vocab;
    U128 positions = 1024, f = Mul(4, hidden);
    if (d.Coin()) c["n_positions"] = static_cast<int64_t>(positions = d.LogUniform(bits));
    if (d.Coin(0.3)) c["n_inner"] = static_cast<int64_t>(f = d.LogUniform(bits));
    const bool tied = d.Coin(0.8);
    if (!tied) c["tie_word_embeddings"] = false;
    const U128 H = hidden;
    U128 layer = Add(Mul(4, H), Add(Mul({H, 3, H}), Mul(3, H)));    // ln_1, ln_2, c_attn
    layer = Add(layer, Add(Mul(H, H), H));                          // attn.c_proj
    layer = Add(layer, Add(Add(Mul(H, f), f), Add(Mul(f, H), H)));  // c_fc, mlp.c_proj
    m.params = Add(Mul(layers, layer), Add(Mul(vocab, H), Add(Mul(positions, H), Mul(2, H))));
    if (!tied) m.params = Add(m.params, Mul(vocab, H));
  } else {
    c["hidden_size"] = h;
    c["num_hidden_layers"] = layers;
    c["num_attention_heads"] = heads;
    c["vocab_size"] = vocab;
    const int64_t f = d.LogUniform(bits);
    c["intermediate_size"] = f;
    int64_t kv = heads;
    if (d.Coin()) c["num_key_value_heads"] = kv = std::max<int64_t>(1, heads >> d.Int(0, 3));
    int64_t head_dim = h / heads;
    if (d.Coin(0.3)) c["head_dim"] = head_dim = d.LogUniform(bits);
    if (d.Coin()) c["max_position_embeddings"] = d.LogUniform(bits);
    const bool tied = d.Coin(0.3);
    c["tie_word_embeddings"] = tied;
    const bool attention_bias = arch != "MixtralForCausalLM" && d.Coin(0.2);
    const bool mlp_bias = arch != "MixtralForCausalLM" && d.Coin(0.2);
    if (attention_bias) c["attention_bias"] = true;
    if (mlp_bias) c["mlp_bias"] = true;
    const U128 H = h, F = f, q = Mul(heads, head_dim), k = Mul(kv, head_dim);
    U128 layer = Add(Mul(2, H), Add(Mul(2, Mul(q, H)), Mul(2, Mul(k, H))));  // norms, q, o, k, v
    if (arch == "Qwen2ForCausalLM") {
      layer = Add(layer, Add(q, Mul(2, k)));  // q/k/v biases, always
    } else if (attention_bias) {
      layer = Add(layer, Add(Add(q, Mul(2, k)), H));  // q/k/v and o biases
    }
    if (arch == "MixtralForCausalLM") {
      const int64_t experts = d.LogUniform(std::min(bits, 14));
      c["num_local_experts"] = experts;
      c["num_experts_per_tok"] = std::max<int64_t>(1, experts >> d.Int(0, 3));
      layer = Add(layer, Add(Mul(experts, H),
                             Mul({static_cast<U128>(experts), 3, F, H})));  // router, experts
    } else {
      layer = Add(layer, Mul({3, F, H}));  // gate, up, down
      if (mlp_bias && arch != "Qwen2ForCausalLM") layer = Add(layer, Add(Mul(2, F), H));
    }
    m.params = Add(Mul(layers, layer), Add(Mul(vocab, H), H));  // + embed, final norm
    if (!tied) m.params = Add(m.params, Mul(vocab, H));
  }
  m.text = c.dump();
  return m;
}

// A JSON spec of a few units with up to three dimensions per param.
RandomModel RandomSpec(Draw& d) {
  const int bits = d.Bits();
  json units = json::array();
  RandomModel m;
  const int num_units = d.Int(1, 6);
  for (int u = 0; u < num_units; ++u) {
    json params = json::array();
    for (int p = d.Int(1, 4); p > 0; --p) {
      json shape = json::array();
      U128 numel = 1;
      if (d.Coin(0.15)) {
        // 2^j x (2^(64-j) + m) = 2^64 + m 2^j: wraps to a small, plausible
        // count in int64 arithmetic (the {2^62 + 1, 4} reproducer's kind).
        const int j = d.Int(2, 62);
        const int64_t m = d.LogUniform(20);
        const bool swap = d.Coin();
        shape.push_back(swap ? int64_t{1} << j : (int64_t{1} << (64 - j)) + m);
        shape.push_back(swap ? (int64_t{1} << (64 - j)) + m : int64_t{1} << j);
        numel = Mul(U128{1} << j, (U128{1} << (64 - j)) + m);
      }
      for (int k = d.Int(shape.empty() ? 1 : 0, 3 - static_cast<int>(shape.size())); k > 0; --k) {
        const int64_t extent = d.LogUniform(bits);
        shape.push_back(extent);
        numel = Mul(numel, extent);
      }
      m.params = Add(m.params, numel);
      params.push_back({{"name", "p" + std::to_string(p)}, {"shape", shape}});
    }
    json unit = {{"name", "u" + std::to_string(u)}, {"params", params}};
    if (d.Coin()) unit["activation_bytes_per_sample"] = d.LogUniform(bits);
    units.push_back(unit);
  }
  m.text = json{{"name", "rnd"}, {"units", units}}.dump();
  return m;
}

void RandomCluster(Draw& d, ClusterSpec& c, PlanOptions& o) {
  c.gpus_per_node = 1 << d.Int(0, 10);
  c.gpus = d.Coin(0.2) ? d.Int(1, c.gpus_per_node)
                       : c.gpus_per_node * (1 << d.Int(0, 20 - __builtin_ctz(c.gpus_per_node)));
  c.gpu_mem_bytes = d.LogUniform(62);
  c.host_mem_bytes = d.LogUniform(62);
  const int bits = d.Bits();
  o.micro_batch = d.Coin(0.5) ? 1 : std::min<int64_t>(d.LogUniform(bits), int64_t{1} << 62);
  o.seq = d.Coin(0.4) ? 0 : std::min<int64_t>(d.LogUniform(bits), int64_t{1} << 62);
  o.grad_accum_steps = static_cast<int>(d.LogUniform(d.Coin(0.8) ? 4 : 20));
  o.precision = d.Pick<Precision>({Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed});
  o.recompute = d.Pick<Recompute>({Recompute::kNone, Recompute::kSelective, Recompute::kFull});
  o.sequence_parallel = d.Coin();
  o.prefetch_depth = d.Int(1, 64);
  if (d.Coin(0.3)) o.stage = d.Int(0, 3);
  if (d.Coin(0.2))
    o.offload = d.Pick<Offload>({Offload::kNone, Offload::kOptimizer, Offload::kOptimizerNvme,
                                 Offload::kOptimizerAndParams});
  if (d.Coin(0.2)) o.tp = 1 << d.Int(0, 3);
  if (d.Coin(0.2)) o.pp = 1 << d.Int(0, 3);
  if (d.Coin(0.3)) o.price_per_gpu_hour = std::exp2(d.Int(-10, 19));
  if (d.Coin(0.3)) o.dataset_tokens = static_cast<double>(d.LogUniform(62));
}

bool Finite(double v) { return std::isfinite(v) && v >= 0; }

// Every number of a report is finite and non-negative; "chosen" may be null.
void ExpectFiniteJson(const json& node, const std::string& path, const std::string& trace) {
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      if (key != "chosen" || !value.is_null()) ExpectFiniteJson(value, path + "." + key, trace);
    }
  } else if (node.is_array()) {
    for (const json& v : node) ExpectFiniteJson(v, path + "[]", trace);
  } else {
    ASSERT_FALSE(node.is_null()) << path << "\n" << trace;
    if (node.is_number()) {
      ASSERT_TRUE(Finite(node.get<double>())) << path << "\n" << trace;
    }
  }
}

U128 Sum(const MemoryBreakdown& m) {
  U128 s = 0;
  for (int64_t v : {m.params, m.grads, m.master, m.optimizer, m.buffers, m.activations, m.workspace,
                    m.reserve}) {
    EXPECT_GE(v, 0);
    s += static_cast<U128>(v);
  }
  return s;
}

void CheckPlan(const Plan& plan, const RandomModel& model, const std::string& trace) {
  ASSERT_LE(model.params, static_cast<U128>(kMaxModelElements)) << trace;
  ASSERT_EQ(static_cast<U128>(plan.params), model.params) << trace;
  const ClusterSpec& cl = plan.cluster;
  const PlanOptions& o = plan.options;
  ASSERT_GE(o.seq, 1) << trace;
  ASSERT_EQ(static_cast<U128>(plan.global_batch),
            Mul({static_cast<U128>(cl.gpus), static_cast<U128>(o.micro_batch),
                 static_cast<U128>(o.grad_accum_steps)}))
      << trace;
  const U128 ranks_per_node = static_cast<U128>(std::min(cl.gpus_per_node, cl.gpus));
  for (const Candidate& c : plan.candidates) {
    const std::string where = c.Label() + "\n" + trace;
    ASSERT_EQ(Sum(c.per_gpu), static_cast<U128>(c.per_gpu.total())) << where;
    ASSERT_EQ(Sum(c.per_rank_host), static_cast<U128>(c.per_rank_host.total())) << where;
    ASSERT_EQ(static_cast<U128>(c.per_node_host_bytes), Sum(c.per_rank_host) * ranks_per_node)
        << where;
    // The breakdown is the buffer list, category by category.
    MemoryBreakdown device, host, nvme;
    for (const PlacedBuffer& b : c.buffers) {
      ASSERT_GE(b.buffer.numel, 0) << b.buffer.name << " " << where;
      const U128 bytes = Mul(b.buffer.numel, DTypeSize(b.buffer.dtype));
      ASSERT_EQ(static_cast<U128>(b.buffer.bytes()), bytes) << b.buffer.name << " " << where;
      MemoryBreakdown& m = b.placement == Placement::kDevice ? device
                           : b.placement == Placement::kHost ? host
                                                             : nvme;
      int64_t& field = b.buffer.category == MemoryCategory::kParams           ? m.params
                       : b.buffer.category == MemoryCategory::kGradients      ? m.grads
                       : b.buffer.category == MemoryCategory::kMasterParams   ? m.master
                       : b.buffer.category == MemoryCategory::kOptimizerState ? m.optimizer
                       : b.buffer.category == MemoryCategory::kCommBuffers    ? m.buffers
                                                                              : m.workspace;
      field += b.buffer.bytes();
    }
    ASSERT_EQ(device.model_states(), c.per_gpu.model_states()) << where;
    ASSERT_EQ(device.buffers, c.per_gpu.buffers) << where;
    ASSERT_EQ(device.workspace + cl.workspace_bytes, c.per_gpu.workspace) << where;
    ASSERT_EQ(host.total(), c.per_rank_host.total()) << where;
    ASSERT_EQ(nvme.total(), c.per_rank_nvme.total()) << where;
    ASSERT_EQ(c.fits,
              c.per_gpu.total() <= cl.gpu_mem_bytes && c.per_node_host_bytes <= cl.host_mem_bytes)
        << where;
    const StepTime& t = c.time;
    for (double v : {t.compute, t.bubble, t.dp_comm, t.tp_comm, t.pp_comm, t.offload, t.total}) {
      ASSERT_TRUE(Finite(v)) << v << " " << where;
    }
    ASSERT_NEAR(t.total, t.compute + t.bubble + t.dp_comm + t.tp_comm + t.pp_comm + t.offload,
                1e-9 * t.total)
        << where;
    ASSERT_TRUE(Finite(c.tokens_per_s) && c.tokens_per_s > 0) << where;
    ASSERT_TRUE(Finite(c.epoch_s) && Finite(c.epoch_cost) && Finite(c.scaling_efficiency)) << where;
  }
  for (const ScalePoint& p : plan.scaling) {
    for (double v : {p.step_s, p.tokens_per_s, p.epoch_s, p.epoch_cost, p.scaling_efficiency}) {
      ASSERT_TRUE(Finite(v)) << "sweep at " << p.gpus << "\n" << trace;
    }
  }
  const json doc = json::parse(FormatJson(plan, /*all=*/true), nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << trace;
  ExpectFiniteJson(doc, "", trace);
  // No inf, nan or negative number in the table either.
  const std::string table = FormatTable(plan, /*all=*/true);
  for (size_t i = 0; i + 1 < table.size(); ++i) {
    const bool starts = i == 0 || !std::isalnum(static_cast<unsigned char>(table[i - 1]));
    if (!starts) continue;
    for (const std::string bad :
         {"inf", "nan", "-0", "-1", "-2", "-3", "-4", "-5", "-6", "-7", "-8", "-9"}) {
      ASSERT_NE(table.compare(i, bad.size(), bad), 0) << bad << " at " << i << "\n"
                                                      << table << "\n"
                                                      << trace;
    }
  }
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderAddressSanitizer = true;
#else
constexpr bool kUnderAddressSanitizer = false;
#endif
#else
constexpr bool kUnderAddressSanitizer = false;
#endif

TEST(PlannerRandomTest, HugeShapesAreRefusedOrCountedExactly) {
  const uint64_t seed = testing::Seed();
  Draw d(seed);
  // A quarter under ASan (5x slower; each outcome still comes up dozens of
  // times): the sanitizer checks the code paths, the Release run the odds.
  constexpr int kCases = kUnderAddressSanitizer ? 500 : 2000;
  int planned = 0, refused_model = 0, refused_plan = 0, hf = 0;
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < kCases; ++i) {
    const RandomModel model = d.Coin(0.7) ? RandomHfConfig(d) : RandomSpec(d);
    ClusterSpec cluster;
    PlanOptions options;
    RandomCluster(d, cluster, options);
    const std::string trace = absl::StrCat("case ", i, " of ", testing::SeedTrace(), "\nmodel ",
                                           model.text.substr(0, 600));
    hf += model.hf;
    const absl::StatusOr<ModelDescription> description =
        model.hf ? ModelFromHfConfig(model.text, "rnd.json")
                 : ModelFromSpecJson(model.text, "rnd.json");
    if (!description.ok()) {
      ++refused_model;
      ASSERT_EQ(description.status().code(), absl::StatusCode::kInvalidArgument) << trace;
      ASSERT_EQ(description.status().message().find('\n'), std::string::npos) << trace;
      // A model past the limit is always refused; a spec within it never.
      if (!model.hf) {
        ASSERT_GT(model.params, static_cast<U128>(kMaxModelElements))
            << description.status() << "\n"
            << trace;
      }
      continue;
    }
    const absl::StatusOr<Plan> plan = Planner::Plan(*description, cluster, options);
    if (!plan.ok()) {
      ++refused_plan;
      ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status() << "\n"
                                                                          << trace;
      ASSERT_FALSE(plan.status().message().empty()) << trace;
      ASSERT_EQ(plan.status().message().find('\n'), std::string::npos) << trace;
      continue;
    }
    ++planned;
    CheckPlan(*plan, model, trace);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::printf(
      "%d cases (%d config.json, %d specs) in %.2f s: %d planned, %d models refused, "
      "%d plans refused\n",
      kCases, hf, kCases - hf, seconds, planned, refused_model, refused_plan);
  // Each outcome happens often enough to mean something.
  EXPECT_GT(planned, kCases / 10);
  EXPECT_GT(refused_model, kCases / 10);
  EXPECT_GT(refused_plan, kCases / 100);
}

}  // namespace
}  // namespace zeroshard
