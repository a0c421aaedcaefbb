// Internal pieces of the `nccl` backend shared by the communicator
// (nccl_communicator.cc) and its bootstraps (nccl_bootstrap.cc: over MPI, or
// threads of one process).
#ifndef ZEROSHARD_ENGINE_SRC_COMM_NCCL_COMMUNICATOR_H_
#define ZEROSHARD_ENGINE_SRC_COMM_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/src/comm/peer_watch.h"
#include "engine/src/device/scoped_cuda_device.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"

namespace zeroshard {
namespace internal {

// InternalError "<where>: <call> failed: <CUDA's text> (CUDA error <code>)".
absl::Status CudaError(const std::string& where, const char* call, cudaError_t code);
// "<where>: <call> failed: <NCCL's text> (NCCL error <code>)", Aborted for
// the codes that mean a peer or the network failed (remote, system), else
// Internal.
absl::Status NcclError(const std::string& where, const char* call, ncclResult_t code);

// The GPU ordinal of a CUDA `device` ("cuda:N"): InvalidArgument when it is
// not a CUDA device, NotFound when this machine has no such GPU (or none).
absl::StatusOr<int> CudaOrdinalOf(const Device& device, const std::string& where);

// Joins rank `rank` of the NCCL group `id` of `size` ranks on GPU `ordinal`
// (collective: every rank must call it with the same id) and returns its
// communicator. `options.timeout` must already be resolved; DeadlineExceeded
// when not every rank joined by `deadline`.
// `peers` says what can be learnt about the other ranks beside NCCL (their
// processes, or a table of failed thread ranks): a rank known gone fails the
// collectives that wait at once, naming it.
absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(int ordinal, int rank, int size,
                                                                  const ncclUniqueId& id,
                                                                  CommOptions options,
                                                                  absl::Time deadline,
                                                                  PeerWatch peers);

}  // namespace internal
}  // namespace zeroshard

#endif  // ZEROSHARD_ENGINE_SRC_COMM_NCCL_COMMUNICATOR_H_
