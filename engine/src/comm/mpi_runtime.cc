// MPI set-up and tear-down for the `mpi` backend: initialisation at the
// thread level the communicator needs, collective creation of a
// communicator that times out instead of hanging, FinalizeMpi and AbortJob.
#include "engine/src/comm/mpi_runtime.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/src/comm/mpi_heartbeat.h"
#include "engine/src/comm/process_probe.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {
namespace {

bool g_we_initialized = false;
// Communicators created so far by this process. Creation is collective, so
// every rank numbers its communicators alike.
uint64_t g_instances_created = 0;
int g_thread_level = MPI_THREAD_SINGLE;
// Serialises MPI calls across communicators when MPI is not MULTIPLE.
std::mutex g_call_mu;

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return absl::StrFormat("MPI error code %d", code);
  }
  return std::string(text, length);
}

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

// Polls a collective request of communicator creation until it completes or
// `deadline` passes. On a timeout the request is left behind (a collective
// cannot be cancelled): the caller is expected to end the job.
absl::Status WaitForCreation(MPI_Request* request, absl::Time deadline, absl::Duration timeout,
                             const char* call) {
  int idle_polls = 0;
  while (true) {
    int done = 0;
    int rc;
    {
      MpiCallLock lock;
      rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS) return MpiError("CreateMpiCommunicator", call, rc);
    if (done) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "CreateMpiCommunicator: timed out after %s in %s: not every rank is creating its "
          "communicator (a rank died, is stuck, or does not call CreateMpiCommunicator the same "
          "number of times); end the job with AbortJob",
          absl::FormatDuration(timeout), call));
    }
    if (++idle_polls < 2000) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

// Open MPI's shared-memory transport (vader) and point-to-point layer (ob1)
// as this engine uses them: one progress thread per rank that makes MPI
// progress only inside its own MPI_Testsome, and that shares its core with
// the trainer (mpirun binds a rank to one core at np <= 2). Open MPI's
// defaults move a large message as 32 KiB fragments, at most 3 in flight per
// send, each step needing a poll on both sides: under a busy trainer a poll
// comes once per scheduler slice, so an 8 MiB reduction took many slices.
// 256 KiB fragments (in a 16 MiB segment per peer) and 64 in flight let a
// message move in a few polls: on 2 bound processes of the example MLP
// (hidden 512, 8 blocks; step_bench, 3 alternating runs) the exposed
// communication of stages 0, 1 and 2 fell from 11.7 / 9.0 / 13.6% of the
// step to 10.0 / 7.1 / 10.7% (docs/communicator.md). Applied only where
// unset: mpirun's --mca flags and OMPI_MCA_* in the environment win;
// ZS_MPI_TRANSPORT_DEFAULTS=0 leaves Open MPI's own defaults.
struct TransportDefault {
  const char* name;
  const char* value;
};
constexpr TransportDefault kOpenMpiTransportDefaults[] = {
    {"OMPI_MCA_btl_vader_max_send_size", "262144"},
    {"OMPI_MCA_btl_vader_segment_size", "16777216"},
    {"OMPI_MCA_pml_ob1_send_pipeline_depth", "64"},
    {"OMPI_MCA_pml_ob1_recv_pipeline_depth", "64"},
};

// Before MPI_Init, which reads OMPI_MCA_* from the environment.
void ApplyOpenMpiTransportDefaults() {
#ifdef OPEN_MPI
  const char* off = std::getenv("ZS_MPI_TRANSPORT_DEFAULTS");
  if (off != nullptr && std::string(off) == "0") return;
  for (const TransportDefault& d : kOpenMpiTransportDefaults) {
    setenv(d.name, d.value, /*overwrite=*/0);
  }
#endif
}

}  // namespace

std::mutex& MpiInitMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

int MpiThreadLevel() { return g_thread_level; }

uint64_t NextMpiInstance() {
  std::lock_guard<std::mutex> lock(MpiInitMutex());
  return g_instances_created++;
}

MpiCallLock::MpiCallLock() {
  if (g_thread_level < MPI_THREAD_MULTIPLE) lock_ = std::unique_lock<std::mutex>(g_call_mu);
}

absl::Status MpiError(const std::string& where, const char* call, int code) {
  return absl::InternalError(
      absl::StrFormat("%s: %s failed: %s (MPI error %d)", where, call, MpiErrorString(code), code));
}

absl::Status EnsureMpiInitialized() {
  std::lock_guard<std::mutex> lock(MpiInitMutex());
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    return absl::FailedPreconditionError(
        "CreateMpiCommunicator: MPI was already finalized; create communicators before "
        "FinalizeMpi()");
  }
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    ApplyOpenMpiTransportDefaults();
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return MpiError("CreateMpiCommunicator", "MPI_Init_thread", rc);
    g_we_initialized = true;
  } else {
    const int rc = MPI_Query_thread(&provided);
    if (rc != MPI_SUCCESS) return MpiError("CreateMpiCommunicator", "MPI_Query_thread", rc);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "CreateMpiCommunicator: MPI provides %s but the communicator calls MPI from its own "
        "thread and needs at least MPI_THREAD_SERIALIZED; initialise MPI with "
        "MPI_Init_thread(MPI_THREAD_MULTIPLE) or let CreateMpiCommunicator do it",
        ThreadLevelName(provided)));
  }
  g_thread_level = provided;
  return absl::OkStatus();
}

bool AbandonRequests(std::vector<MPI_Request>& requests,
                     const std::function<bool(size_t)>& is_recv) {
  std::vector<MPI_Request> cancelled;
  for (size_t i = 0; i < requests.size(); ++i) {
    MPI_Request& request = requests[i];
    if (request == MPI_REQUEST_NULL) continue;
    if (is_recv(i)) {
      MPI_Cancel(&request);
      cancelled.push_back(request);
    } else {
      MPI_Request_free(&request);
    }
    request = MPI_REQUEST_NULL;
  }
  const absl::Time give_up = absl::Now() + absl::Milliseconds(50);
  int done = 0;
  const int n = static_cast<int>(cancelled.size());
  while (n > 0) {
    MPI_Testall(n, cancelled.data(), &done, MPI_STATUSES_IGNORE);
    if (done || absl::Now() >= give_up) break;
    sched_yield();
  }
  if (n == 0 || done) return false;
  for (MPI_Request& request : cancelled) {
    if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  }
  return true;
}

}  // namespace internal

bool HaveMpi() { return true; }

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(CommOptions options) {
  if (options.device != nullptr && options.device->kind() != DeviceKind::kCpu) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CreateMpiCommunicator: the mpi backend moves host memory, not %s's; use the nccl "
        "backend for GPU memory",
        options.device->name()));
  }
  absl::StatusOr<absl::Duration> timeout = ResolveCommTimeout(options);
  if (!timeout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateMpiCommunicator: ", timeout.status().message()));
  }
  options.timeout = *timeout;
  ZS_RETURN_IF_ERROR(internal::EnsureMpiInitialized());
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 0;
  int64_t tag_space = 32768;  // MPI guarantees tags up to at least 32767.
  std::vector<internal::ProcessIdentity> processes;
  // Creation is collective (every rank must create its communicator): the
  // nonblocking forms let a missing rank become a timeout, not a hang.
  const absl::Time deadline = absl::Now() + options.timeout;
  MPI_Request request = MPI_REQUEST_NULL;
  int rc;
  {
    internal::MpiCallLock lock;
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request);
  }
  if (rc != MPI_SUCCESS) {
    return internal::MpiError("CreateMpiCommunicator", "MPI_Comm_idup(MPI_COMM_WORLD)", rc);
  }
  ZS_RETURN_IF_ERROR(
      internal::WaitForCreation(&request, deadline, options.timeout, "MPI_Comm_idup"));
  // Send and Recv get a communicator of their own: their MPI tags never
  // meet the collectives'.
  MPI_Comm p2p_comm = MPI_COMM_NULL;
  {
    internal::MpiCallLock lock;
    rc = MPI_Comm_idup(comm, &p2p_comm, &request);
  }
  if (rc != MPI_SUCCESS) {
    return internal::MpiError("CreateMpiCommunicator", "MPI_Comm_idup(point-to-point)", rc);
  }
  ZS_RETURN_IF_ERROR(internal::WaitForCreation(&request, deadline, options.timeout,
                                               "MPI_Comm_idup(point-to-point)"));
  {
    internal::MpiCallLock lock;
    rc = MPI_Comm_set_errhandler(p2p_comm, MPI_ERRORS_RETURN);
  }
  if (rc != MPI_SUCCESS) {
    return internal::MpiError("CreateMpiCommunicator", "MPI_Comm_set_errhandler", rc);
  }
  {
    internal::MpiCallLock lock;
    rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &size);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&comm);
      return internal::MpiError("CreateMpiCommunicator", "MPI_Comm_set_errhandler/rank/size", rc);
    }
    void* tag_ub = nullptr;
    int found = 0;
    if (MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &found) == MPI_SUCCESS && found) {
      tag_space = static_cast<int64_t>(*static_cast<int*>(tag_ub)) + 1;
    }
  }
  // Every rank learns every rank's process, so that a rank waiting for a
  // peer on the same machine can tell a dead peer from a stuck one.
  const internal::ProcessIdentity self = internal::ThisProcess();
  processes.resize(size);
  {
    internal::MpiCallLock lock;
    rc = MPI_Iallgather(&self, sizeof(self), MPI_BYTE, processes.data(), sizeof(self), MPI_BYTE,
                        comm, &request);
  }
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return internal::MpiError("CreateMpiCommunicator", "MPI_Iallgather(process identities)", rc);
  }
  ZS_RETURN_IF_ERROR(
      internal::WaitForCreation(&request, deadline, options.timeout, "MPI_Iallgather"));
  // Which ranks share a node: MPI's shared-memory split. MPI has no
  // nonblocking split, but every rank has just proven itself here (the
  // identities came from all of them). Each rank's node is named by the
  // lowest rank of its split (local rank 0, translated without messages),
  // and those leaders are exchanged like the identities.
  int leader = -1;
  {
    internal::MpiCallLock lock;
    MPI_Comm local = MPI_COMM_NULL;
    rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    if (rc == MPI_SUCCESS) {
      MPI_Group local_group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
      const int zero = 0;
      rc = MPI_Comm_group(local, &local_group);
      if (rc == MPI_SUCCESS) rc = MPI_Comm_group(comm, &world_group);
      if (rc == MPI_SUCCESS) {
        rc = MPI_Group_translate_ranks(local_group, 1, &zero, world_group, &leader);
      }
      if (local_group != MPI_GROUP_NULL) MPI_Group_free(&local_group);
      if (world_group != MPI_GROUP_NULL) MPI_Group_free(&world_group);
      MPI_Comm_free(&local);
    }
  }
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return internal::MpiError("CreateMpiCommunicator", "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)",
                              rc);
  }
  std::vector<int32_t> leaders(size, -1);
  const int32_t my_leader = leader;
  {
    internal::MpiCallLock lock;
    rc = MPI_Iallgather(&my_leader, 1, MPI_INT32_T, leaders.data(), 1, MPI_INT32_T, comm, &request);
  }
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return internal::MpiError("CreateMpiCommunicator", "MPI_Iallgather(node leaders)", rc);
  }
  ZS_RETURN_IF_ERROR(internal::WaitForCreation(&request, deadline, options.timeout,
                                               "MPI_Iallgather(node leaders)"));
  std::vector<int> other_nodes;  // world ranks off this rank's node
  for (int r = 0; r < size; ++r) {
    processes[r].node_leader = leaders[r];
    processes[r].world_rank = r;
    if (leaders[r] != my_leader) other_nodes.push_back(r);
  }
  // A job that spans nodes watches them (every rank sees the same nodes, so
  // either all start the heartbeats here or none).
  if (std::any_of(leaders.begin(), leaders.end(), [&](int32_t l) { return l != leaders[0]; })) {
    ZS_RETURN_IF_ERROR(
        internal::StartHeartbeats(comm, std::move(other_nodes), deadline, options.timeout));
  }
  const uint64_t instance = internal::NextMpiInstance();
  return internal::NewMpiCommunicator(comm, p2p_comm, rank, size, tag_space, instance,
                                      std::move(processes), options);
}

void FinalizeMpi() {
  std::lock_guard<std::mutex> lock(internal::MpiInitMutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) internal::StopHeartbeats();
  if (internal::g_we_initialized && !finalized) MPI_Finalize();
}

void AbortJob(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    // The launcher forwards our stderr through a pipe but learns of the abort
    // through its own channel, and prints its notice first unless the error
    // had time to arrive: give it that time.
    absl::SleepFor(absl::Milliseconds(250));
    // Some launcher settings (OpenMPI's --enable-recovery) keep the job alive
    // after MPI_Abort and leave the caller blocked in it: end this process
    // regardless once the launcher had its chance.
    std::thread([exit_code] {
      absl::SleepFor(absl::Seconds(3));
      std::_Exit(exit_code);
    }).detach();
    // Below MPI_THREAD_MULTIPLE a progress thread may be inside an MPI call:
    // take the call lock if it comes free soon, abort regardless otherwise.
    std::unique_lock<std::mutex> lock(internal::g_call_mu, std::defer_lock);
    if (internal::g_thread_level < MPI_THREAD_MULTIPLE) {
      const absl::Time give_up = absl::Now() + absl::Seconds(1);
      while (!lock.try_lock() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    }
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  std::_Exit(exit_code);
}

}  // namespace zeroshard
