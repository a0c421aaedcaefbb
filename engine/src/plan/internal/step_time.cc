#include "engine/src/plan/internal/step_time.h"

#include <algorithm>

#include "zeroshard/estimate/fine_tuning.h"

namespace zeroshard {
namespace internal {
namespace {

double AttentionFlopsPerToken(const ModelDescription& model, const PlanOptions& options) {
  if (!model.transformer.has_value()) return 0.0;
  const TransformerShape& t = *model.transformer;
  // Q K^T and (softmax) V: 2 matmuls of 2 s (a d) FLOPs per token per layer
  // in the forward; the backward costs twice the forward.
  return 12.0 * static_cast<double>(options.seq) * static_cast<double>(t.heads) *
         static_cast<double>(t.head_dim) * static_cast<double>(t.layers);
}

// Params one token computes with: a mixture of experts runs only its top-k
// experts; a tied param is one tensor, counted once (as CountParams does).
double ActiveParams(const ModelDescription& model) {
  return static_cast<double>(model.active_params > 0 ? model.active_params
                                                     : model.spec.NumStoredParams());
}

// The active params that get a weight gradient: ActiveParams scaled by the
// trainable share of the stored params (a dense model's trainable params).
double TrainableActiveParams(const ModelDescription& model) {
  const ParamCounts counts = CountParams(model.spec);
  if (counts.frozen == 0) return ActiveParams(model);
  if (counts.total() == 0) return 0.0;
  return ActiveParams(model) * static_cast<double>(counts.trainable) /
         static_cast<double>(counts.total());
}

int ParamBytes(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

}  // namespace

double ModelFlopsPerStep(const ModelDescription& model, const PlanOptions& options,
                         int64_t global_batch) {
  const double tokens = static_cast<double>(global_batch) * static_cast<double>(options.seq);
  return tokens * (4.0 * ActiveParams(model) + 2.0 * TrainableActiveParams(model) +
                   AttentionFlopsPerToken(model, options));
}

double RingSeconds(int n, double bytes, double gbps, double latency_us) {
  if (n <= 1) return 0.0;
  const double steps = static_cast<double>(n - 1);
  return steps * latency_us * 1e-6 + steps / static_cast<double>(n) * bytes / (gbps * 1e9);
}

StepTime EstimateStepTime(const ModelDescription& model, const ClusterSpec& cluster,
                          const PlanOptions& options, int64_t global_batch, const Candidate& c,
                          const RankSizes& sizes) {
  StepTime time;
  const double tokens = static_cast<double>(global_batch) * static_cast<double>(options.seq);
  const double n = ActiveParams(model);
  const double attention = AttentionFlopsPerToken(model, options);
  double flops = ModelFlopsPerStep(model, options, global_batch);
  // Recomputation repeats part of the forward (a third of forward+backward).
  if (options.recompute == Recompute::kFull) flops += tokens * (2.0 * n + attention / 3.0);
  if (options.recompute == Recompute::kSelective) flops += tokens * attention / 3.0;
  const double peak =
      (options.precision == Precision::kFp32 ? cluster.peak_tflops_fp32 : cluster.peak_tflops) *
      1e12;
  time.compute = flops / static_cast<double>(cluster.gpus) / (peak * cluster.mfu);
  const double m = static_cast<double>(c.micro_batches);
  time.bubble = time.compute * static_cast<double>(c.pp - 1) / m;

  // Data parallelism: tp varies fastest, then dp, then pp, so the dp group
  // stays inside a node when tp * dp <= gpus_per_node.
  const bool dp_in_node = c.tp * c.dp <= cluster.gpus_per_node;
  const double dp_gbps = dp_in_node ? cluster.intra_node_gbps : cluster.inter_node_gbps;
  const double dp_lat = dp_in_node ? cluster.intra_node_latency_us : cluster.inter_node_latency_us;
  const double param_bytes = static_cast<double>(sizes.full_numel) * ParamBytes(options.precision);
  // Gradients (in the param dtype) and updated params exist for the
  // trainable params only; stage 3 still gathers the frozen ones.
  const double trainable_bytes =
      static_cast<double>(sizes.trainable_full_numel) * ParamBytes(options.precision);
  const double rs_grads = RingSeconds(c.dp, trainable_bytes, dp_gbps, dp_lat);
  const double ag_updated = RingSeconds(c.dp, trainable_bytes, dp_gbps, dp_lat);
  const double ag_params = RingSeconds(c.dp, param_bytes, dp_gbps, dp_lat);
  double dp_comm = 0;
  switch (c.stage) {
    case 0:
      dp_comm = 2 * rs_grads;
      break;  // all-reduce
    case 1:
      dp_comm = rs_grads + ag_updated;
      break;
    case 2:
      dp_comm = m * rs_grads + ag_updated;
      break;  // reduce-scatter every micro-batch
    default:
      dp_comm = m * (rs_grads + 2 * ag_params);
      break;  // gather in forward and backward
  }
  time.dp_comm = dp_comm - cluster.comm_overlap * std::min(dp_comm, time.compute);

  const double act_bytes = options.precision == Precision::kFp32 ? 4.0 : 2.0;
  // In double: s x b x h may pass 2^63 even where the activations per GPU
  // (divided by t with sequence parallelism) fit.
  const double sbh_bytes = model.transformer.has_value()
                               ? static_cast<double>(options.seq) *
                                     static_cast<double>(options.micro_batch) *
                                     static_cast<double>(model.transformer->hidden) * act_bytes
                               : 0.0;
  if (c.tp > 1) {
    // Megatron: two all-reduces (or all-gather + reduce-scatter with
    // sequence parallelism) in the forward and two in the backward of each
    // layer, per micro-batch, inside the node.
    time.tp_comm =
        m * static_cast<double>(sizes.layers) * 4.0 * 2.0 *
        RingSeconds(c.tp, sbh_bytes, cluster.intra_node_gbps, cluster.intra_node_latency_us);
  }
  if (c.pp > 1) {
    const bool crosses = cluster.gpus > cluster.gpus_per_node;
    const double gbps = crosses ? cluster.inter_node_gbps : cluster.intra_node_gbps;
    const double lat = crosses ? cluster.inter_node_latency_us : cluster.intra_node_latency_us;
    const double send = sbh_bytes / (options.sequence_parallel ? c.tp : 1);
    time.pp_comm = m * 2.0 * (lat * 1e-6 + send / (gbps * 1e9));
  }
  if (c.offload.enabled()) {
    // The CPU Adam steps the trainable shard; its gradient goes to the host
    // and its updated params come back over PCIe (the engine streams them
    // in chunks); offloaded params move whole, twice per micro-batch.
    const double shard = static_cast<double>(c.stage == 0 ? sizes.trainable_full_numel
                                                          : sizes.trainable_shard_numel);
    const double params_shard = static_cast<double>(sizes.shard_numel);
    const double pcie = cluster.pcie_gbps * 1e9;
    const double adam = shard / (cluster.cpu_adam_gparams_per_s * 1e9);
    double swap = 0;
    if (c.offload.optimizer == MemoryTier::kNvme) {
      // The fp32 master (mixed precision) and both moments are read and
      // written back every step; the engine overlaps the I/O with the
      // update, so the slower of the two counts.
      const double state_bytes = shard * 4.0 * (options.precision == Precision::kFp32 ? 2.0 : 3.0);
      swap = state_bytes / (cluster.nvme_read_gbps * 1e9) +
             state_bytes / (cluster.nvme_write_gbps * 1e9);
    }
    time.offload = shard * 2.0 * ParamBytes(options.precision) / pcie + std::max(adam, swap);
    if (c.offload.params != MemoryTier::kDevice) {
      time.offload += m * 2.0 * params_shard * ParamBytes(options.precision) / pcie;
    }
  }
  time.total =
      time.compute + time.bubble + time.dp_comm + time.tp_comm + time.pp_comm + time.offload;
  return time;
}

}  // namespace internal
}  // namespace zeroshard
