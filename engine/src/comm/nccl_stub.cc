// Builds without NCCL (or without CUDA): the backend exists but says so.
#include "zeroshard/communicator.h"

namespace zeroshard {

bool HaveNccl() { return false; }

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Device& device,
                                                                     CommOptions options) {
  return absl::UnimplementedError(
      "CreateNcclCommunicator: built without NCCL; reconfigure on a machine with the CUDA "
      "toolkit and NCCL (nvcc, nccl.h and libnccl; -DZS_NCCL=ON makes their absence an error), "
      "or use the local or mpi backend");
}

absl::Status RunNcclLocalRanks(const std::vector<Device*>& devices,
                               const std::function<absl::Status(int rank, Communicator& comm)>& fn,
                               CommOptions options) {
  return absl::UnimplementedError(
      "RunNcclLocalRanks: built without NCCL; reconfigure on a machine with the CUDA toolkit and "
      "NCCL, or use RunLocalRanks");
}

}  // namespace zeroshard
