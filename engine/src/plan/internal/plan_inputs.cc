#include "engine/src/plan/internal/plan_inputs.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/src/common/checked_math.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/gpt_example_tensors.h"
#include "zeroshard/estimate/byte_units.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {
namespace {

constexpr int64_t kDefaultSeq = 2048;
constexpr int64_t kDefaultMaxSeq = 4096;

absl::Status InvalidArgument(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

constexpr int kMaxGpusPerNode = 1024;
constexpr int64_t kMaxBytes = int64_t{1} << 62;

struct Range {
  const char* name;
  double value;
  NumberRange range;
};

// "--mfu 0 is outside the supported range [0.001, 1]; give a value in it",
// the value in as few digits as read back the same ("1000001", not
// "1e+06"); NaN fails every comparison.
absl::Status CheckRanges(std::initializer_list<Range> ranges) {
  for (const Range& r : ranges) {
    if (!r.range.Contains(r.value)) {
      return InvalidArgument(absl::StrFormat(
          "%s %s is outside the supported range [%s, %s]; give a value in it", r.name,
          FormatNumber(r.value), FormatNumber(r.range.min), FormatNumber(r.range.max)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateCluster(const ClusterSpec& c) {
  if (c.gpus < 1 || c.gpus > kMaxWorldSize) {
    return InvalidArgument(
        absl::StrFormat("--gpus %d must be in [1, %d] (2^20)", c.gpus, kMaxWorldSize));
  }
  if (c.gpus_per_node < 1 || c.gpus_per_node > kMaxGpusPerNode) {
    return InvalidArgument(
        absl::StrFormat("--gpus-per-node %d must be in [1, %d]", c.gpus_per_node, kMaxGpusPerNode));
  }
  if (c.gpus > c.gpus_per_node && c.gpus % c.gpus_per_node != 0) {
    return InvalidArgument(
        absl::StrFormat("--gpus %d is not a whole number of nodes of %d GPUs; use a multiple of %d",
                        c.gpus, c.gpus_per_node, c.gpus_per_node));
  }
  const std::pair<const char*, int64_t> sizes[] = {{"--gpu-mem", c.gpu_mem_bytes},
                                                   {"--host-mem", c.host_mem_bytes}};
  for (const auto& [name, bytes] : sizes) {
    if (bytes <= 0 || bytes > kMaxBytes) {
      return InvalidArgument(
          absl::StrFormat("%s %d bytes must be positive and at most 2^62", name, bytes));
    }
  }
  if (c.reserve_bytes < 0 || c.workspace_bytes < 0 || c.reserve_bytes > kMaxBytes ||
      c.workspace_bytes > kMaxBytes) {
    return InvalidArgument("--reserve and --workspace must be in [0, 2^62] bytes");
  }
  // Bounds that keep every time and cost finite: a step's FLOPs stay below
  // 10^60, divided by at least 10^6 FLOP/s.
  return CheckRanges({{"--intra-node-bw", c.intra_node_gbps, kBandwidthGbpsRange},
                      {"--inter-node-bw", c.inter_node_gbps, kBandwidthGbpsRange},
                      {"--pcie-bw", c.pcie_gbps, kBandwidthGbpsRange},
                      {"--nvme-read-gbps", c.nvme_read_gbps, kBandwidthGbpsRange},
                      {"--nvme-write-gbps", c.nvme_write_gbps, kBandwidthGbpsRange},
                      {"--peak-tflops", c.peak_tflops, kPeakTflopsRange},
                      {"--peak-tflops (fp32)", c.peak_tflops_fp32, kPeakTflopsRange},
                      {"--mfu", c.mfu, kMfuRange},
                      {"comm overlap", c.comm_overlap, NumberRange{0, 1}},
                      {"--intra-node-latency", c.intra_node_latency_us, kLatencyUsRange},
                      {"--inter-node-latency", c.inter_node_latency_us, kLatencyUsRange},
                      {"CPU Adam rate", c.cpu_adam_gparams_per_s, kCpuAdamGparamsRange}});
}

absl::StatusOr<PlanOptions> ResolveOptions(const ModelDescription& model,
                                           const ClusterSpec& cluster, PlanOptions o) {
  const bool transformer = model.transformer.has_value();
  if (o.seq == 0) {
    // Long-context models train most of their steps far below their
    // maximum context; 4096 is a common pre-training length.
    o.seq = transformer && model.transformer->max_positions > 0
                ? std::min<int64_t>(model.transformer->max_positions, kDefaultMaxSeq)
                : kDefaultSeq;
  }
  if (o.seq < 1) return InvalidArgument(absl::StrFormat("--seq %d must be >= 1", o.seq));
  if (transformer && model.transformer->learned_positions &&
      o.seq > model.transformer->max_positions) {
    return InvalidArgument(absl::StrFormat("--seq %d exceeds the model's %d learned positions",
                                           o.seq, model.transformer->max_positions));
  }
  if (o.micro_batch < 1) {
    return InvalidArgument(absl::StrFormat("--micro-batch %d must be >= 1", o.micro_batch));
  }
  if (o.grad_accum_steps < 1) {
    return InvalidArgument(absl::StrFormat("--grad-accum %d must be >= 1", o.grad_accum_steps));
  }
  if (o.num_grad_buffers < 1 || o.prefetch_depth < 1) {
    return InvalidArgument("gradient buffers and prefetch depth must be >= 1");
  }
  if (o.stage < -1 || o.stage > 3) {
    return InvalidArgument(absl::StrFormat("--stage %d is not auto, 0, 1, 2 or 3", o.stage));
  }
  if (o.offload.has_value()) {
    const Offload& off = *o.offload;
    const bool moves_states = off.grads != MemoryTier::kDevice || off.params != MemoryTier::kDevice;
    if (moves_states && off.optimizer == MemoryTier::kDevice) {
      return InvalidArgument(absl::StrFormat(
          "--offload %s: gradients or params on the host serve the host update; offload the "
          "optimizer too (optimizer=host or optimizer=nvme)",
          OffloadName(off)));
    }
    if (off.params != MemoryTier::kDevice && o.stage >= 0 && o.stage != 3) {
      return InvalidArgument(absl::StrFormat(
          "--offload %s needs --stage 3 for params=host (params are sharded)", OffloadName(off)));
    }
  }
  if (o.tp < 0 || o.pp < 0) return InvalidArgument("--tp and --pp must be >= 1");
  if (o.tp > 1) {
    if (!transformer) {
      return InvalidArgument(
          "--tp > 1 needs a transformer (--preset or --hf-config): a custom spec does not say "
          "how its params split");
    }
    const TransformerShape& t = *model.transformer;
    if (t.heads % o.tp != 0 || t.kv_heads % o.tp != 0) {
      return InvalidArgument(
          absl::StrFormat("--tp %d must divide the %d attention heads and %d key/value heads", o.tp,
                          t.heads, t.kv_heads));
    }
    if (o.tp > cluster.gpus_per_node) {
      return InvalidArgument(absl::StrFormat(
          "--tp %d exceeds the %d GPUs of a node; tensor parallelism stays within a node", o.tp,
          cluster.gpus_per_node));
    }
  }
  if (o.pp > 1) {
    if (model.num_layer_units == 0) {
      return InvalidArgument("--pp > 1 needs a model with layers (--preset or --hf-config)");
    }
    if (model.num_layer_units % o.pp != 0) {
      return InvalidArgument(
          absl::StrFormat("--pp %d must divide the %d layers", o.pp, model.num_layer_units));
    }
  }
  const int64_t split = int64_t{std::max(o.tp, 1)} * std::max(o.pp, 1);
  if (cluster.gpus % split != 0) {
    return InvalidArgument(
        absl::StrFormat("--gpus %d is not divisible by tp x pp = %d", cluster.gpus, split));
  }
  // A tp x pp candidate runs grad_accum_steps x tp x pp <= grad_accum_steps
  // x gpus micro-batches per step: keep that an int.
  if (int64_t{o.grad_accum_steps} * cluster.gpus > std::numeric_limits<int>::max()) {
    return InvalidArgument(absl::StrFormat(
        "--grad-accum %d x --gpus %d micro-batches per step pass 2^31; lower --grad-accum",
        o.grad_accum_steps, cluster.gpus));
  }
  ZS_RETURN_IF_ERROR(
      CheckRanges({{"--price", o.price_per_gpu_hour, kPricePerGpuHourRange},
                   {"--tokens", o.dataset_tokens, NumberRange{0, kMaxDatasetTokens}}}));
  if (o.activations == ActivationModel::kGptExample) {
    // The GPT example runs ZeRO data parallelism on the engine alone.
    if (o.tp > 1 || o.pp > 1) {
      return InvalidArgument(
          "--activations gpt-example: the GPT example runs without tensor or pipeline "
          "parallelism; drop --tp and --pp");
    }
    if (o.offload.has_value() && *o.offload != Offload::kNone) {
      return InvalidArgument(
          "--activations gpt-example: the GPT example runs without offload; drop --offload");
    }
    o.tp = o.pp = 1;
    o.offload = Offload::kNone;
    ZS_RETURN_IF_ERROR(GptExampleTensors(model, o).status());
  }
  return o;
}

// Sequences per optimizer step, checked: it and the tokens per step
// (x seq) must fit in int64_t.
absl::StatusOr<int64_t> GlobalBatch(const ClusterSpec& cluster, const PlanOptions& o) {
  const CheckedInt64 batch = CheckedInt64(cluster.gpus) * o.micro_batch * o.grad_accum_steps;
  if (!batch.ok() || !(batch * o.seq).ok()) {
    return InvalidArgument(absl::StrFormat(
        "--gpus %d x --micro-batch %d x --grad-accum %d sequences of --seq %d tokens pass 2^63 "
        "tokens per step; lower --micro-batch, --grad-accum or --seq",
        cluster.gpus, o.micro_batch, o.grad_accum_steps, o.seq));
  }
  return *batch.value();
}

}  // namespace internal
}  // namespace zeroshard
