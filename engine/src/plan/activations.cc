#include "engine/src/plan/activations.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_format.h"
#include "engine/src/common/checked_math.h"
#include "zeroshard/status.h"

namespace zeroshard {

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

absl::StatusOr<Recompute> ParseRecompute(absl::string_view name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  return absl::InvalidArgumentError(
      absl::StrFormat("--recompute: '%s' is not one of none, selective, full", name));
}

const char* ActivationModelName(ActivationModel m) {
  switch (m) {
    case ActivationModel::kKorthikanti:
      return "korthikanti";
    case ActivationModel::kGptExample:
      return "gpt-example";
  }
  return "?";
}

absl::StatusOr<ActivationModel> ParseActivationModel(absl::string_view name) {
  if (name == "korthikanti") return ActivationModel::kKorthikanti;
  if (name == "gpt-example") return ActivationModel::kGptExample;
  return absl::InvalidArgumentError(absl::StrFormat(
      "--activations: '%s' is not one of korthikanti (a Megatron-style layer), gpt-example "
      "(the GPT example's tensors)",
      name));
}

namespace internal {
namespace {

// Per-layer activations in units of sbh, split by what tensor parallelism
// without sequence parallelism leaves replicated.
struct LayerTerms {
  double replicated_values = 0;  // 16/32-bit tensors (x sbh)
  double replicated_masks = 0;   // 1-byte dropout masks (x sbh)
  double split_values = 0;       // divided by t
  double split_masks = 0;
  double score_values = 0;  // attention scores, x as^2 b (always divided by t)
  double score_masks = 0;
};

LayerTerms CountLayer(const TransformerShape& m) {
  const double h = static_cast<double>(m.hidden);
  // 1 for MHA with a*d = h; < 1 for K and V with grouped queries.
  const double q = static_cast<double>(m.heads) * static_cast<double>(m.head_dim) / h;
  const double kv = static_cast<double>(m.kv_heads) * static_cast<double>(m.head_dim) / h;
  const double f = static_cast<double>(m.intermediate) / h;
  const double dropout = m.dropout ? 1.0 : 0.0;
  LayerTerms t;
  // Inputs of the two norms, of the QKV projection and of the first MLP
  // projection are full-size on every tensor-parallel rank (Korthikanti's
  // 10 sbh = 4 + 2 + 2 + 1 + 1 with the two dropout masks).
  t.replicated_values = 2 + 1 + 1;
  t.replicated_masks = 2 * dropout;
  // Q and K for Q K^T, V for the weighted sum, the context for the output
  // projection.
  t.split_values = q + kv + kv + q;
  // MLP: GELU keeps its input and output (the second projection's input);
  // SwiGLU keeps the gate and up outputs, silu(gate) and their product.
  const double mlp = m.gated_mlp ? 4 * f : 2 * f;
  if (m.experts > 0) {
    // Mixture of experts: each token runs through k experts, each keeping
    // what a dense MLP keeps. Per token and expert the routing also keeps
    // the dispatched copy of the input (the expert's first projections need
    // it) and the expert's output (scaled by the routing weight, whose
    // gradient needs it): full width, like the MLP input. The router keeps
    // its softmax over the E experts.
    const double k = static_cast<double>(m.experts_per_token);
    t.split_values += k * mlp;
    t.replicated_values += 2 * k + static_cast<double>(m.experts) / h;
  } else {
    t.split_values += mlp;
  }
  // Scores: softmax output; with dropout also its mask and output.
  t.score_values = 1 + dropout;
  t.score_masks = dropout;
  return t;
}

// `bytes` as an exact integer count, or InvalidArgument when it does not fit.
absl::StatusOr<int64_t> ToBytes(double bytes, const char* what, const ActivationShape& shape) {
  const std::optional<int64_t> n = RoundToInt64(bytes);
  if (!n.has_value() || *n < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "activations: %s would keep %.3g bytes (--seq %d, --micro-batch %d), more than a 64-bit "
        "byte count holds; lower --seq or --micro-batch",
        what, bytes, shape.seq, shape.micro_batch));
  }
  return *n;
}

double Sbh(const TransformerShape& model, const ActivationShape& shape) {
  return static_cast<double>(shape.seq) * static_cast<double>(shape.micro_batch) *
         static_cast<double>(model.hidden);
}

}  // namespace

absl::StatusOr<int64_t> LayerActivationBytes(const TransformerShape& model,
                                             const ActivationShape& shape) {
  const double sbh = Sbh(model, shape);
  const double t = static_cast<double>(shape.tp);
  const double value_bytes = static_cast<double>(shape.activation_bytes);
  if (shape.recompute == Recompute::kFull) {
    return ToBytes(sbh * value_bytes / (shape.sequence_parallel ? t : 1.0), "one layer's input",
                   shape);
  }
  const LayerTerms terms = CountLayer(model);
  const double replicated = terms.replicated_values * value_bytes + terms.replicated_masks;
  const double split = terms.split_values * value_bytes + terms.split_masks;
  double bytes =
      sbh * (shape.sequence_parallel ? (replicated + split) / t : replicated + split / t);
  if (shape.recompute == Recompute::kNone) {
    // a s^2 b = sbh * (a s / h); scores are split over heads.
    const double scores = sbh * static_cast<double>(model.heads) * static_cast<double>(shape.seq) /
                          static_cast<double>(model.hidden);
    bytes += scores * (terms.score_values * value_bytes + terms.score_masks) / t;
  }
  return ToBytes(bytes, "one layer", shape);
}

absl::StatusOr<int64_t> RecomputeWorkingBytes(const TransformerShape& model,
                                              const ActivationShape& shape) {
  if (shape.recompute != Recompute::kFull) return 0;
  ActivationShape rebuilt = shape;
  rebuilt.recompute = Recompute::kSelective;
  ZS_ASSIGN_OR_RETURN(const int64_t working_set, LayerActivationBytes(model, rebuilt));
  ZS_ASSIGN_OR_RETURN(const int64_t stored_input, LayerActivationBytes(model, shape));
  // The selective set holds the layer input (the first norm's input) with
  // the same split, so the difference is never negative.
  return working_set - stored_input;
}

absl::StatusOr<int64_t> EmbeddingActivationBytes(const TransformerShape& model,
                                                 const ActivationShape& shape) {
  if (!model.dropout) return 0;
  return ToBytes(Sbh(model, shape) / (shape.sequence_parallel ? shape.tp : 1),
                 "the embedding dropout mask", shape);
}

absl::StatusOr<int64_t> OutputActivationBytes(const TransformerShape& model,
                                              const ActivationShape& shape) {
  const double sb = static_cast<double>(shape.seq) * static_cast<double>(shape.micro_batch);
  const double t = static_cast<double>(shape.tp);
  // Final norm input and LM-head input: replicated across the tensor-parallel
  // group unless sequence parallelism splits them along the sequence.
  const double inputs =
      2.0 * sb * static_cast<double>(model.hidden) * static_cast<double>(shape.activation_bytes);
  // fp32 logits: the head is vocabulary-parallel, each rank holds V/t.
  const double logits = 4.0 * sb * static_cast<double>(model.vocab);
  return ToBytes((shape.sequence_parallel ? inputs / t : inputs) + logits / t, "the output layer",
                 shape);
}

}  // namespace internal
}  // namespace zeroshard
