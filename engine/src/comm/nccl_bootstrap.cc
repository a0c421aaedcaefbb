// How the ranks of the `nccl` backend find each other: over MPI (one process
// per GPU, CreateNcclCommunicator) or as threads of one process
// (RunNcclLocalRanks). Either way every rank joins the NCCL group of one
// ncclUniqueId that one rank made.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/src/comm/nccl_communicator.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/status.h"

#if ZS_HAVE_MPI
#include <mpi.h>

#include "engine/src/comm/mpi_runtime.h"
#endif

namespace zeroshard {

bool HaveNccl() { return true; }

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Device& device,
                                                                     CommOptions options) {
  constexpr char kWhere[] = "CreateNcclCommunicator";
  ZS_ASSIGN_OR_RETURN(const int ordinal, internal::CudaOrdinalOf(device, kWhere));
  absl::StatusOr<absl::Duration> timeout = ResolveCommTimeout(options);
  if (!timeout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(kWhere, ": ", timeout.status().message()));
  }
  options.timeout = *timeout;
#if !ZS_HAVE_MPI
  return absl::UnimplementedError(
      "CreateNcclCommunicator: built without MPI, which it needs to start one rank per process; "
      "reconfigure with -DZS_MPI=ON, or run the ranks as threads of one process with "
      "RunNcclLocalRanks");
#else
  ZS_RETURN_IF_ERROR(internal::EnsureMpiInitialized());
  const absl::Time deadline = absl::Now() + options.timeout;
  int rank = 0;
  int size = 0;
  {
    internal::MpiCallLock lock;
    int rc = MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rc != MPI_SUCCESS) return internal::MpiError(kWhere, "MPI_Comm_rank/size", rc);
  }
  // Rank 0 makes the id; a failure there travels with it, so the other ranks
  // fail at once instead of waiting for an id that never comes.
  struct IdMessage {
    int32_t error;
    ncclUniqueId id;
  } message{};
  if (rank == 0) message.error = static_cast<int32_t>(ncclGetUniqueId(&message.id));
  MPI_Request request = MPI_REQUEST_NULL;
  {
    internal::MpiCallLock lock;
    const int rc = MPI_Ibcast(&message, sizeof(message), MPI_BYTE, 0, MPI_COMM_WORLD, &request);
    if (rc != MPI_SUCCESS) return internal::MpiError(kWhere, "MPI_Ibcast(NCCL id)", rc);
  }
  while (true) {
    int done = 0;
    int rc;
    {
      internal::MpiCallLock lock;
      rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS) return internal::MpiError(kWhere, "MPI_Test(NCCL id)", rc);
    if (done) break;
    if (absl::Now() >= deadline) {
      // The broadcast cannot be cancelled: the caller must end the job.
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s: rank %d did not receive the NCCL id from rank 0 within %s (rank 0 is stuck, dead "
          "or not calling CreateNcclCommunicator); end the job with AbortJob",
          kWhere, rank, absl::FormatDuration(options.timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (message.error != ncclSuccess) {
    return internal::NcclError(absl::StrFormat("%s (on rank 0)", kWhere), "ncclGetUniqueId",
                               static_cast<ncclResult_t>(message.error));
  }
  return internal::NewNcclCommunicator(ordinal, rank, size, message.id, options, deadline);
#endif
}

absl::Status RunNcclLocalRanks(const std::vector<Device*>& devices,
                               const std::function<absl::Status(int rank, Communicator& comm)>& fn,
                               CommOptions options) {
  constexpr char kWhere[] = "RunNcclLocalRanks";
  if (devices.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: no devices; give one CUDA device per rank", kWhere));
  }
  std::vector<int> ordinals;
  std::set<int> seen;
  for (size_t r = 0; r < devices.size(); ++r) {
    const std::string where = absl::StrFormat("%s: rank %d", kWhere, r);
    if (devices[r] == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: the device is null", where));
    }
    ZS_ASSIGN_OR_RETURN(const int ordinal, internal::CudaOrdinalOf(*devices[r], where));
    if (!seen.insert(ordinal).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: cuda:%d is already another rank's; NCCL needs one GPU per rank", where, ordinal));
    }
    ordinals.push_back(ordinal);
  }
  absl::StatusOr<absl::Duration> timeout = ResolveCommTimeout(options);
  if (!timeout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(kWhere, ": ", timeout.status().message()));
  }
  options.timeout = *timeout;
  ncclUniqueId id;
  const ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) return internal::NcclError(kWhere, "ncclGetUniqueId", rc);

  const int world = static_cast<int>(devices.size());
  const absl::Time deadline = absl::Now() + options.timeout;
  std::vector<absl::Status> results(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      // Joining blocks until every rank joined, hence one thread per rank.
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          internal::NewNcclCommunicator(ordinals[r], r, world, id, options, deadline);
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      // fn's CUDA calls go to this rank's GPU.
      internal::ScopedCudaDevice on_device(ordinals[r]);
      results[r] = fn(r, **comm);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < world; ++r) {
    if (!results[r].ok()) {
      return absl::Status(results[r].code(),
                          absl::StrFormat("rank %d: %s", r, results[r].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace zeroshard
