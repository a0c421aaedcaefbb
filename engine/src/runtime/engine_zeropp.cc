// EngineImpl's ZeRO++ set-up (TrainSpec::zeropp; docs/multinode.md,
// "ZeRO++"): hpZ's secondary groups, qgZ's backend check. qwZ needs no set-up
// (ParamGatherer packs and unpacks per gather), nor does qgZ beyond the
// check (GradReducer runs its reduce-scatters).
#include "absl/strings/str_format.h"
#include "engine/src/runtime/engine_impl.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

absl::Status CheckQuantizedGradsBackend(const TrainSpec& train, const Device& device,
                                        const Communicator& comm) {
  if (train.zeropp.quantized_grad_bits == 0) return absl::OkStatus();
  if (device.kind() != DeviceKind::kCpu || !device.host_accessible()) {
    return absl::UnimplementedError(absl::StrFormat(
        "Engine::Create: zeropp.quantized_grad_bits (qgZ) quantizes and sums on the host, but "
        "device %s keeps the gradients in GPU memory (the '%s' communicator); qgZ runs on CPU "
        "devices with the local or mpi backend for now: set it to 0 here",
        device.name(), comm.backend()));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::SetUpSecondaryGroup() {
  const int size = plan_.secondary_partition_size;
  if (size == 0) return absl::OkStatus();
  // Each group of `size` consecutive ranks on one node: that is what keeps
  // the backward's gathers inside the node.
  const NodeLayout nodes = comm_.node_layout();
  const int first = rank_ / size * size;
  for (int r = first; r < first + size; ++r) {
    if (nodes.node_of_rank[r] != nodes.node_of_rank[first]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Engine::Create: zeropp.secondary_partition_size %d groups ranks %d-%d, but rank %d is "
          "on %s and rank %d on %s (%s); hpZ's groups must each lie on one node: set it to the "
          "ranks per node and place ranks by node",
          size, first, first + size - 1, first, nodes.node_names[nodes.node_of_rank[first]], r,
          nodes.node_names[nodes.node_of_rank[r]], nodes.Describe()));
    }
  }
  ZS_ASSIGN_OR_RETURN(secondary_group_, comm_.Split(rank_ / size, rank_));
  if (secondary_group_ == nullptr || secondary_group_->size() != size ||
      secondary_group_->rank() != rank_ - first) {
    return absl::InternalError("Engine::Create: hpZ's group split went wrong");
  }
  gatherer_->set_secondary_group(secondary_group_.get());
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
