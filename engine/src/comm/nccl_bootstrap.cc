// How the ranks of the `nccl` backend find each other: over MPI (one process
// per GPU, CreateNcclCommunicator) or as threads of one process
// (RunNcclLocalRanks). Either way every rank joins the NCCL group of one
// ncclUniqueId that one rank made.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
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
#include "engine/src/comm/peer_watch.h"
#include "engine/src/comm/process_probe.h"
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
  // Waits for a nonblocking MPI call against the deadline; a request that
  // cannot complete cannot be cancelled either, so the caller must end the
  // job.
  const auto wait = [&](MPI_Request* request, const char* call,
                        const char* missing) -> absl::Status {
    while (true) {
      int done = 0;
      int rc;
      {
        internal::MpiCallLock lock;
        rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
      }
      if (rc != MPI_SUCCESS) return internal::MpiError(kWhere, call, rc);
      if (done) return absl::OkStatus();
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "%s: rank %d: %s did not complete within %s (%s); end the job with AbortJob", kWhere,
            rank, call, absl::FormatDuration(options.timeout), missing));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  MPI_Request request = MPI_REQUEST_NULL;
  {
    internal::MpiCallLock lock;
    const int rc = MPI_Ibcast(&message, sizeof(message), MPI_BYTE, 0, MPI_COMM_WORLD, &request);
    if (rc != MPI_SUCCESS) return internal::MpiError(kWhere, "MPI_Ibcast(NCCL id)", rc);
  }
  ZS_RETURN_IF_ERROR(wait(&request, "MPI_Ibcast(NCCL id)",
                          "rank 0 is stuck, dead or not calling CreateNcclCommunicator"));
  if (message.error != ncclSuccess) {
    return internal::NcclError(absl::StrFormat("%s (on rank 0)", kWhere), "ncclGetUniqueId",
                               static_cast<ncclResult_t>(message.error));
  }
  // Every rank's process, so that a waiting collective can tell a dead peer
  // on this machine from a stuck one (PeerWatch).
  std::vector<internal::ProcessIdentity> processes(size);
  const internal::ProcessIdentity self = internal::ThisProcess();
  {
    internal::MpiCallLock lock;
    const int rc = MPI_Iallgather(&self, sizeof(self), MPI_BYTE, processes.data(), sizeof(self),
                                  MPI_BYTE, MPI_COMM_WORLD, &request);
    if (rc != MPI_SUCCESS) return internal::MpiError(kWhere, "MPI_Iallgather(processes)", rc);
  }
  ZS_RETURN_IF_ERROR(wait(&request, "MPI_Iallgather(processes)",
                          "a rank is stuck, dead or not calling CreateNcclCommunicator"));
  return internal::NewNcclCommunicator(ordinal, rank, size, message.id, options, deadline,
                                       internal::PeerWatch(rank, std::move(processes)));
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
  // A rank that fails marks itself here: its peers' waiting collectives then
  // fail at once, naming it, instead of timing out.
  auto failed = std::make_shared<internal::PeerWatch::ThreadTable>(world);
  // The rank that failed first: its error is the cause, the others' follow.
  std::atomic<int> first_failed{-1};
  const auto mark_failed = [&](int r) {
    int none = -1;
    first_failed.compare_exchange_strong(none, r);
    failed->MarkFailed(r);
  };
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      // Joining blocks until every rank joined, hence one thread per rank.
      absl::StatusOr<std::unique_ptr<Communicator>> comm = internal::NewNcclCommunicator(
          ordinals[r], r, world, id, options, deadline, internal::PeerWatch(r, world, failed));
      if (!comm.ok()) {
        results[r] = comm.status();
        mark_failed(r);
        return;
      }
      // fn's CUDA calls go to this rank's GPU.
      internal::ScopedCudaDevice on_device(ordinals[r]);
      results[r] = fn(r, **comm);
      if (!results[r].ok()) mark_failed(r);
    });
  }
  for (std::thread& thread : threads) thread.join();
  if (const int r = first_failed.load(); r >= 0) {
    return absl::Status(results[r].code(), absl::StrFormat("rank %d: %s", r, results[r].message()));
  }
  for (int r = 0; r < world; ++r) {
    if (!results[r].ok()) {
      return absl::Status(results[r].code(),
                          absl::StrFormat("rank %d: %s", r, results[r].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace zeroshard
