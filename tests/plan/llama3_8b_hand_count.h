// The per-GPU bytes of one planner case counted by hand, from the model's
// config and the rules docs/memory_model.md states, without the planner:
// Llama-3-8B (meta-llama/Meta-Llama-3-8B's config.json) at 128k tokens on 64
// GPUs as tp 8 x pp 1 x dp 8, ZeRO stage 1, bf16 mixed precision, no
// offload, full recomputation with sequence parallelism, micro-batch 1, the
// default cluster (256 MiB workspace, 1 GiB reserve) and the default two
// gradient staging slots. planner_test and estimate_cli_test compare the
// planner's breakdown and the CLI's JSON with it field by field.
#ifndef ZEROSHARD_TESTS_PLAN_LLAMA3_8B_HAND_COUNT_H_
#define ZEROSHARD_TESTS_PLAN_LLAMA3_8B_HAND_COUNT_H_

#include <cstdint>

namespace zeroshard::testing {

struct HandCountedBytes {
  int64_t params, grads, master, optimizer, buffers, activations, workspace, reserve;
  int64_t total() const {
    return params + grads + master + optimizer + buffers + activations + workspace + reserve;
  }
};

namespace llama3_8b {

// config.json: hidden_size, intermediate_size, num_attention_heads,
// num_key_value_heads, vocab_size, num_hidden_layers; head_dim = h / heads.
inline constexpr int64_t kHidden = 4096, kInter = 14336, kHeads = 32, kKvHeads = 8;
inline constexpr int64_t kVocab = 128256, kLayers = 32, kHeadDim = kHidden / kHeads;
// The case.
inline constexpr int64_t kTp = 8, kDp = 8, kSeq = 131072, kMicroBatch = 1;

// One tensor-parallel rank's params (Megatron's split): the token embedding
// and the LM head split by vocabulary rows; q, k, v, gate and up by output
// rows, o and down by input columns; the RMSNorm weights (two per layer and
// the final one) replicated. No biases in Llama.
inline constexpr int64_t kEmbedSlice = kVocab / kTp * kHidden;  // and the LM head's
inline constexpr int64_t kLayerSlice =
    (kHeads * kHeadDim + 2 * kKvHeads * kHeadDim) * kHidden / kTp  // q, k, v
    + kHidden * kHeads * kHeadDim / kTp                            // o
    + 3 * kInter * kHidden / kTp                                   // gate, up, down
    + 2 * kHidden;                                                 // the two norms
inline constexpr int64_t kRankParams = 2 * kEmbedSlice + kLayers * kLayerSlice + kHidden;
static_assert(kVocab % kTp == 0 && kInter % kTp == 0, "the split is exact");
// Every param is a multiple of the layout's 64-element alignment, and each
// unit (embedding, layer, final norm, head) of dp x 128 elements, so the
// flat layout adds no padding: the counts below are exact.
static_assert(kEmbedSlice % (kDp * 128) == 0 && kLayerSlice % (kDp * 128) == 0 &&
                  kHidden % (kDp * 128) == 0 && kHidden % 64 == 0,
              "no layout padding");
inline constexpr int64_t kRankShard = kRankParams / kDp;

// Korthikanti et al. 2022 with sequence parallelism; s b h / t elements.
inline constexpr int64_t kSbhOverT = kSeq * kMicroBatch * kHidden / kTp;
// A layer under full recomputation keeps its input: 2 sbh/t bytes.
inline constexpr int64_t kStoredInputBytes = 2 * kSbhOverT;
// The one layer rebuilt in the backward keeps the selective set less its
// stored input. The selective set in values per sbh/t: the two norm inputs,
// the QKV input and the MLP input (4); Q, K, V and the attention context
// (1 + 2 n_kv d / h + 1); SwiGLU's gate, up, silu(gate) and product
// (4 f / h). No dropout masks (Llama has none), no s x s scores.
// At 2 bytes a value, the bytes per sbh/t are twice the values.
inline constexpr int64_t kSelectiveBytesPerSbhOverT =
    2 * 4 + 2 * 2 + 2 * 2 * kKvHeads * kHeadDim / kHidden + 2 * 4 * kInter / kHidden;
static_assert(2 * 2 * kKvHeads * kHeadDim % kHidden == 0 && 2 * 4 * kInter % kHidden == 0,
              "whole bytes per sbh/t");
inline constexpr int64_t kRebuiltLayerBytes =
    kSelectiveBytesPerSbhOverT * kSbhOverT - kStoredInputBytes;
// The last stage: the final norm's and the head's inputs (2 sbh values, split
// by t with sequence parallelism) and the vocabulary-parallel fp32 logits.
inline constexpr int64_t kOutputBytes =
    (2 * kSeq * kMicroBatch * kHidden * 2 + 4 * kSeq * kMicroBatch * kVocab) / kTp;

}  // namespace llama3_8b

inline HandCountedBytes Llama3_8bTp8Dp8Stage1FullRecompute128k() {
  using namespace llama3_8b;
  HandCountedBytes b{};
  b.params = 2 * kRankParams;        // bf16, whole below stage 3
  b.grads = 2 * kRankParams;         // bf16, whole below stage 2
  b.master = 4 * kRankShard;         // fp32 master of the rank's dp shard
  b.optimizer = 2 * 4 * kRankShard;  // Adam m and v, fp32, of the shard
  // tp x pp = 8 micro-batches per step accumulate, so the engine stages
  // gradients: two slots of the largest unit (the embedding or the head
  // slice), bf16.
  b.buffers = 2 * kEmbedSlice * 2;
  // No pipeline: one micro-batch in flight; every layer's stored input, the
  // rebuilt layer, the output layer; no embedding dropout mask.
  b.activations = kLayers * kStoredInputBytes + kRebuiltLayerBytes + kOutputBytes;
  // The cluster's 256 MiB plus the gradient norm's fp64 block sums, one per
  // 128 elements of the shard.
  b.workspace = (int64_t{256} << 20) + (kRankShard + 127) / 128 * 8;
  b.reserve = int64_t{1} << 30;
  return b;
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_PLAN_LLAMA3_8B_HAND_COUNT_H_
