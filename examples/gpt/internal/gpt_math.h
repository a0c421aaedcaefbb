// The math of the GPT example (a GPT-2-architecture decoder) on raw fp32
// arrays, apart from the engine, so that every piece is tested against a
// double-precision reference (tests/examples/gpt_math_test.cc).
//
// Shapes: a micro-batch of B sequences of T tokens, N = B * T rows, width C
// (n_embd), H heads of D = C / H, vocabulary V, P positions (T <= P).
// Weights are in Hugging Face GPT-2's layouts: Conv1D weights are [in, out]
// (y = x W + b), embeddings [V, C] and [P, C]. Per block (unit "h.i"), in
// the order of GPT-2's state dict (BlockParam):
//   a   = x + c_proj(attn(c_attn(ln_1(x))))
//   y   = a + mlp.c_proj(gelu_new(mlp.c_fc(ln_2(a))))
// attn: causal multi-head self-attention, softmax(q k^T / sqrt(D)) v per head;
// gelu_new(u) = 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))).
// The model: x0 = wte[token] + wpe[t]; blocks; ln_f; logits = x wte^T (the
// LM head IS wte, tied); loss = mean over the N rows of -log softmax[target].
//
// Every result depends only on its inputs and sizes: single-threaded BLAS
// and loops in a fixed order, so two ranks computing the same micro-batch
// get the same bits.
#ifndef ZEROSHARD_EXAMPLES_GPT_INTERNAL_GPT_MATH_H_
#define ZEROSHARD_EXAMPLES_GPT_INTERNAL_GPT_MATH_H_

#include <cstdint>

namespace zeroshard {
namespace gpt {
namespace internal {

struct GptDims {
  int64_t batch = 0;      // B
  int64_t seq = 0;        // T
  int64_t width = 0;      // C
  int64_t heads = 0;      // H (divides C)
  int64_t vocab = 0;      // V
  int64_t positions = 0;  // P
  float eps = 1e-5f;      // LayerNorm epsilon
  int64_t rows() const { return batch * seq; }
  int64_t head_dim() const { return width / heads; }
};

// A block's params, in GPT-2's state-dict order (unit "h.i").
enum BlockParam : int {
  kLn1Weight = 0,  // ln_1.weight [C]
  kLn1Bias,        // ln_1.bias [C]
  kAttnWeight,     // attn.c_attn.weight [C, 3C] (q, k, v columns)
  kAttnBias,       // attn.c_attn.bias [3C]
  kProjWeight,     // attn.c_proj.weight [C, C]
  kProjBias,       // attn.c_proj.bias [C]
  kLn2Weight,      // ln_2.weight [C]
  kLn2Bias,        // ln_2.bias [C]
  kFcWeight,       // mlp.c_fc.weight [C, 4C]
  kFcBias,         // mlp.c_fc.bias [4C]
  kFcProjWeight,   // mlp.c_proj.weight [4C, C]
  kFcProjBias,     // mlp.c_proj.bias [C]
  kNumBlockParams
};

// What a block's backward needs of its forward, besides the block input x.
// The caller owns the arrays (BlockActsFloats(dims) floats in all, in this
// order, see BlockActsView).
struct BlockActs {
  float* ln1 = nullptr;       // [N, C] ln_1(x)
  float* ln1_mean = nullptr;  // [N]
  float* ln1_rstd = nullptr;  // [N] 1 / sqrt(var + eps)
  float* qkv = nullptr;       // [N, 3C]
  float* att = nullptr;       // [B, H, T, T] softmax probabilities (upper triangle 0)
  float* atty = nullptr;      // [N, C] attention output, heads concatenated
  float* res1 = nullptr;      // [N, C] a = x + c_proj(atty)
  float* ln2 = nullptr;       // [N, C] ln_2(a)
  float* ln2_mean = nullptr;  // [N]
  float* ln2_rstd = nullptr;  // [N]
  float* fc = nullptr;        // [N, 4C] c_fc(ln2), before the GELU
  float* fc_gelu = nullptr;   // [N, 4C] gelu_new(fc)
};
// Floats of one BlockActs: N (15 C + 4) + B H T^2. With tp > 1, those of
// one rank of a tensor-parallel group (tensor_parallel_block.h): qkv, att,
// atty, fc and fc_gelu hold its heads' and hidden units' share (C / tp,
// H / tp), ln1, res1, ln2 and the moments stay whole.
int64_t BlockActsFloats(const GptDims& d, int tp = 1);
// Points the fields into `base` (BlockActsFloats(d, tp) floats).
BlockActs BlockActsView(const GptDims& d, float* base, int tp = 1);
// Floats of the scratch BlockForward / BlockBackward (and AttentionBackward)
// need, whatever the implementation chooses (documented in the .cc).
int64_t BlockScratchFloats(const GptDims& d);

// x0[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]. Token ids in [0, V).
void EmbedForward(const float* wte, const float* wpe, const int32_t* tokens, const GptDims& d,
                  float* x0);
// dwte = 0, dwpe = 0, then rows in order: dwte[token] += dx0, dwpe[t] += dx0.
// (The embedding use of wte only; the head's use is HeadBackward's.)
void EmbedBackward(const int32_t* tokens, const float* dx0, const GptDims& d, float* dwte,
                   float* dwpe);

// One block: y [N, C] from x [N, C]; fills `acts`. `p` indexed by BlockParam.
void BlockForward(const float* const* p, const GptDims& d, const float* x, const BlockActs& acts,
                  float* y, float* scratch);
// dx [N, C] and the block's gradients `g` (indexed by BlockParam, each
// overwritten) from dy [N, C]. `acts` as BlockForward left them for this x.
void BlockBackward(const float* const* p, const GptDims& d, const float* x, const BlockActs& acts,
                   const float* dy, float* dx, float* const* g, float* scratch);

// LayerNorm over the last dimension of x [N, C]: out = (x - mean) * rstd * w + b.
void LayerNormForward(const float* x, const float* w, const float* b, int64_t rows, int64_t width,
                      float eps, float* out, float* mean, float* rstd);
// dx (overwritten), dw and db (overwritten) from dout.
void LayerNormBackward(const float* x, const float* w, const float* mean, const float* rstd,
                       const float* dout, int64_t rows, int64_t width, float* dx, float* dw,
                       float* db);

// logits [N, V] = x [N, C] wte^T.
void HeadForward(const float* wte, const float* x, const GptDims& d, float* logits);
// Mean cross-entropy over the N rows of `logits` against `targets` (max
// subtracted, sums in double, index order). Overwrites `logits` with
// dL/dlogits * seed = (softmax - onehot) * seed / N. Returns the loss.
double CrossEntropy(float* logits, const int32_t* targets, const GptDims& d, float seed);
// dwte (the head's use, overwritten) = dlogits^T x; dx (overwritten) = dlogits wte.
void HeadBackward(const float* wte, const float* x, const float* dlogits, const GptDims& d,
                  float* dwte, float* dx);

// Conv1D (HF's y = b + x W, W [in, out]): y [rows, out] = bias + x W, the
// bias as the sgemm's C operand (as torch.addmm). Backward: dw [in, out] =
// x^T dy, db = dy's column sums in row order, dx [rows, in] = dy W^T when
// dx is not null; everything overwritten. dst += src elementwise.
void Conv1DForward(const float* x, const float* w, const float* bias, int64_t rows, int64_t in,
                   int64_t out, float* y);
void Conv1DBackward(const float* x, const float* w, const float* dy, int64_t rows, int64_t in,
                    int64_t out, float* dx, float* dw, float* db);
void AddInPlace(const float* src, int64_t n, float* dst);

// The pieces BlockForward / BlockBackward are made of, exposed for tests.
// qkv [N, 3C] -> att [B, H, T, T] (probabilities), out [N, C].
void AttentionForward(const float* qkv, const GptDims& d, float* att, float* out);
// dqkv [N, 3C] (overwritten) from dout [N, C].
void AttentionBackward(const float* qkv, const float* att, const float* dout, const GptDims& d,
                       float* dqkv, float* scratch);
void GeluForward(const float* u, int64_t n, float* out);
// du (overwritten) = dout * gelu_new'(u).
void GeluBackward(const float* u, const float* dout, int64_t n, float* du);

}  // namespace internal
}  // namespace gpt
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_GPT_INTERNAL_GPT_MATH_H_
