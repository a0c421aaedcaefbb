// Korthikanti et al. 2022, Section 4: activation bytes per layer.
#include "engine/src/plan/activations.h"

#include "gtest/gtest.h"

namespace zeroshard::internal {
namespace {

int64_t Must(const absl::StatusOr<int64_t>& bytes) {
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.value_or(-1);
}

// A GPT layer as the paper counts it: multi-head attention, 4h GELU MLP,
// dropout, 16-bit activations.
TransformerShape GptLayer() {
  TransformerShape m;
  m.architecture = "GPT2LMHeadModel";
  m.hidden = 1600;
  m.heads = 25;
  m.kv_heads = 25;
  m.head_dim = 64;
  m.intermediate = 4 * 1600;
  m.layers = 48;
  m.vocab = 50257;
  m.dropout = true;
  return m;
}

TEST(ActivationsTest, NoParallelismNoRecomputationIsSbhTimes34Plus5AsOverH) {
  const TransformerShape m = GptLayer();
  for (int64_t s : {512, 1024}) {
    for (int64_t b : {1, 4}) {
      ActivationShape shape;
      shape.seq = s;
      shape.micro_batch = b;
      const double sbh = static_cast<double>(s * b * m.hidden);
      const double expected = sbh * (34.0 + 5.0 * m.heads * s / m.hidden);
      EXPECT_EQ(Must(LayerActivationBytes(m, shape)), static_cast<int64_t>(expected))
          << "s " << s << " b " << b;
    }
  }
}

TEST(ActivationsTest, TensorSequenceParallelAndRecomputation) {
  const TransformerShape m = GptLayer();
  ActivationShape shape;
  shape.seq = 1024;
  shape.micro_batch = 4;
  shape.tp = 5;
  const double s = 1024, h = 1600, a = 25, t = 5, sbh = 1024.0 * 4 * 1600;
  EXPECT_EQ(Must(LayerActivationBytes(m, shape)),
            static_cast<int64_t>(sbh * (10 + 24 / t + 5 * a * s / (h * t))));
  shape.sequence_parallel = true;
  EXPECT_EQ(Must(LayerActivationBytes(m, shape)),
            static_cast<int64_t>(sbh / t * (34 + 5 * a * s / h)));
  shape.recompute = Recompute::kSelective;
  EXPECT_EQ(Must(LayerActivationBytes(m, shape)), static_cast<int64_t>(34 * sbh / t));
  shape.sequence_parallel = false;
  EXPECT_EQ(Must(LayerActivationBytes(m, shape)), static_cast<int64_t>(sbh * (10 + 24 / t)));
  shape.recompute = Recompute::kFull;
  EXPECT_EQ(Must(LayerActivationBytes(m, shape)), static_cast<int64_t>(2 * sbh));
  shape.sequence_parallel = true;
  EXPECT_EQ(Must(LayerActivationBytes(m, shape)), static_cast<int64_t>(2 * sbh / t));
  // Full recomputation rebuilds one layer at a time, with flash attention:
  // the selective set less the stored input (34 sbh/t - 2 sbh/t with sp).
  EXPECT_EQ(Must(RecomputeWorkingBytes(m, shape)), static_cast<int64_t>(32 * sbh / t));
  // Output layer with sequence parallelism: 4 sbh/t (1 + V/h).
  EXPECT_EQ(Must(OutputActivationBytes(m, shape)),
            static_cast<int64_t>(4 * sbh / t * (1 + 50257.0 / h) + 0.5));
}

TEST(ActivationsTest, GroupedQueryAttentionAndSwiGluAreCountedTensorByTensor) {
  TransformerShape m = GptLayer();
  m.dropout = false;
  ActivationShape shape;
  shape.seq = 256;
  shape.recompute = Recompute::kSelective;
  const int64_t mha = Must(LayerActivationBytes(m, shape));
  m.kv_heads = 5;  // K and V shrink to a fifth
  const double sbh = 256.0 * 1600;
  EXPECT_EQ(mha - Must(LayerActivationBytes(m, shape)), static_cast<int64_t>(2 * 2 * sbh * 0.8));
  m.gated_mlp = true;  // gate, up, silu and product instead of GELU in/out
  EXPECT_EQ(Must(LayerActivationBytes(m, shape)) - (mha - static_cast<int64_t>(2 * 2 * sbh * 0.8)),
            static_cast<int64_t>(2 * 2 * 4 * sbh));
  shape.activation_bytes = 4;  // fp32 doubles every value (no masks without dropout)
  ActivationShape half = shape;
  half.activation_bytes = 2;
  EXPECT_EQ(Must(LayerActivationBytes(m, shape)), 2 * Must(LayerActivationBytes(m, half)));
}

// A Llama-3-8B layer (GQA, SwiGLU, no dropout) at 2k-128k tokens.
TransformerShape Llama3Layer() {
  TransformerShape m;
  m.architecture = "LlamaForCausalLM";
  m.hidden = 4096;
  m.heads = 32;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.intermediate = 14336;
  m.layers = 32;
  m.vocab = 128256;
  m.gated_mlp = true;
  return m;
}

TEST(ActivationsTest, FullRecomputationNeverNeedsMoreThanSelective) {
  const TransformerShape m = Llama3Layer();
  for (int64_t s : {2048, 4096, 32768, 131072}) {
    for (int tp : {1, 8}) {
      for (bool sp : {false, true}) {
        ActivationShape full;
        full.seq = s;
        full.tp = tp;
        full.sequence_parallel = sp && tp > 1;
        full.recompute = Recompute::kFull;
        ActivationShape selective = full;
        selective.recompute = Recompute::kSelective;
        const int64_t input = Must(LayerActivationBytes(m, full));
        const int64_t working = Must(RecomputeWorkingBytes(m, full));
        const int64_t layer = Must(LayerActivationBytes(m, selective));
        // The rebuilt layer keeps the selective (flash-attention) set; its
        // input is the stored checkpoint, counted once.
        EXPECT_EQ(working, layer - input) << "s " << s << " tp " << tp << " sp " << sp;
        // No s^2 term: the working set is linear in the sequence.
        ActivationShape twice = full;
        twice.seq = 2 * s;
        EXPECT_EQ(Must(RecomputeWorkingBytes(m, twice)), 2 * working) << "s " << s;
        for (int64_t layers : {1, 2, 32}) {
          EXPECT_LE(layers * input + working, layers * layer) << "s " << s << " L " << layers;
        }
      }
    }
  }
  ActivationShape none;
  none.recompute = Recompute::kNone;
  none.seq = 4096;
  EXPECT_EQ(Must(RecomputeWorkingBytes(m, none)), 0);
}

TEST(ActivationsTest, OutputInputsSplitByTpOnlyWithSequenceParallelism) {
  const TransformerShape m = Llama3Layer();
  ActivationShape shape;
  shape.seq = 4096;
  shape.micro_batch = 2;
  shape.tp = 8;
  const double sb = 4096.0 * 2, h = 4096, v = 128256, t = 8;
  // Without sp every rank holds the final norm's and the head's inputs
  // whole; only the vocabulary-parallel fp32 logits split.
  EXPECT_EQ(Must(OutputActivationBytes(m, shape)),
            static_cast<int64_t>(2 * sb * h * 2 + 4 * sb * v / t));
  shape.sequence_parallel = true;
  EXPECT_EQ(Must(OutputActivationBytes(m, shape)),
            static_cast<int64_t>((2 * sb * h * 2 + 4 * sb * v) / t));
  shape.tp = 1;
  shape.sequence_parallel = false;
  EXPECT_EQ(Must(OutputActivationBytes(m, shape)),
            static_cast<int64_t>(2 * sb * h * 2 + 4 * sb * v));
}

TEST(ActivationsTest, MixtureOfExpertsKeepsTheTopKExpertsWorkingSets) {
  TransformerShape dense = Llama3Layer();
  dense.intermediate = 14336;
  TransformerShape moe = dense;
  moe.architecture = "MixtralForCausalLM";
  moe.experts = 8;
  moe.experts_per_token = 2;
  for (int tp : {1, 4}) {
    ActivationShape shape;
    shape.seq = 4096;
    shape.tp = tp;
    shape.recompute = Recompute::kSelective;
    const double sbh = 4096.0 * 4096, f = 14336.0 / 4096, k = 2, e = 8.0 / 4096;
    // One more expert's SwiGLU set (4f, split by t) per token, plus per
    // token and expert the routed input copy and the expert output, and the
    // router's softmax over 8 experts (replicated): 2-byte values.
    const double extra = sbh * 2 * ((k - 1) * 4 * f / tp + 2 * k + e);
    EXPECT_EQ(Must(LayerActivationBytes(moe, shape)) - Must(LayerActivationBytes(dense, shape)),
              static_cast<int64_t>(extra))
        << "tp " << tp;
  }
}

TEST(ActivationsTest, BytesPast2To63AreAnErrorNamingTheFlags) {
  const TransformerShape m = Llama3Layer();
  ActivationShape shape;
  shape.seq = int64_t{1} << 40;
  shape.micro_batch = int64_t{1} << 20;
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    shape.recompute = r;
    const absl::StatusOr<int64_t> bytes = LayerActivationBytes(m, shape);
    ASSERT_FALSE(bytes.ok()) << *bytes;
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bytes.status().message().find("--micro-batch"), std::string::npos) << bytes.status();
  }
  EXPECT_FALSE(OutputActivationBytes(m, shape).ok());
  // Just below: exact and positive.
  shape.micro_batch = 1;
  shape.seq = int64_t{1} << 30;
  shape.recompute = Recompute::kFull;
  EXPECT_EQ(Must(LayerActivationBytes(m, shape)), (int64_t{1} << 30) * 4096 * 2);
}

TEST(ActivationsTest, ParsesNames) {
  EXPECT_EQ(*ParseRecompute("full"), Recompute::kFull);
  EXPECT_FALSE(ParseRecompute("some").ok());
}

}  // namespace
}  // namespace zeroshard::internal
