// The heartbeat thread (mpi_heartbeat.h says what it is for).
#include "engine/src/comm/mpi_heartbeat.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/src/comm/mpi_runtime.h"

namespace zeroshard {
namespace internal {
namespace {

// What a beat carries: nothing but its arrival. One constant buffer for
// every send, never written, so a send still in flight never reads a
// changing buffer.
const int64_t kBeat = 1;
constexpr int kHeartbeatTag = 7;
// How often the thread looks for arrived beats.
constexpr absl::Duration kPoll = absl::Milliseconds(20);

struct Heartbeats {
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<int> watched;                           // world ranks on other nodes
  std::vector<int> index_of;                          // [world rank] -> index in watched, or -1
  std::unique_ptr<std::atomic<int64_t>[]> last_beat;  // [index] -> arrival, ns since epoch
  std::atomic<int64_t> last_poll{0};                  // when the thread last looked, ns
  std::vector<MPI_Request> receives;
  std::vector<int64_t> inbox;
  std::atomic<bool> stop{false};
  std::thread thread;
};

// Set once, by the first StartHeartbeats, and never freed: MPI may still
// write into its receive buffers after StopHeartbeats let them go.
std::mutex g_mu;
Heartbeats* g_heartbeats = nullptr;
// Stopped heartbeats stay reachable from here (not a leak to the leak
// checker): MPI may still write into their buffers.
Heartbeats* g_stopped = nullptr;
bool g_started = false;

void Run(Heartbeats* h) {
  absl::Time next_send = absl::Now();
  const int n = static_cast<int>(h->watched.size());
  std::vector<int> indices(n);
  while (!h->stop.load()) {
    const absl::Time now = absl::Now();
    if (now >= next_send) {
      for (int peer : h->watched) {
        MpiCallLock lock;
        MPI_Request request = MPI_REQUEST_NULL;
        if (MPI_Isend(&kBeat, 1, MPI_INT64_T, peer, kHeartbeatTag, h->comm, &request) ==
            MPI_SUCCESS) {
          MPI_Request_free(&request);  // completes on its own; the buffer never changes
        }
      }
      next_send = now + kHeartbeatInterval;
    }
    // Every beat that arrived since the last look (several may be queued).
    while (true) {
      int completed = 0;
      int rc;
      {
        MpiCallLock lock;
        rc = MPI_Testsome(n, h->receives.data(), &completed, indices.data(), MPI_STATUSES_IGNORE);
      }
      if (rc != MPI_SUCCESS || completed == MPI_UNDEFINED || completed == 0) break;
      const int64_t arrived = absl::GetCurrentTimeNanos();
      for (int k = 0; k < completed; ++k) {
        const int i = indices[k];
        h->last_beat[i].store(arrived);
        MpiCallLock lock;
        MPI_Irecv(&h->inbox[i], 1, MPI_INT64_T, h->watched[i], kHeartbeatTag, h->comm,
                  &h->receives[i]);
      }
    }
    h->last_poll.store(absl::GetCurrentTimeNanos());
    absl::SleepFor(kPoll);
  }
}

}  // namespace

absl::Duration HeartbeatLimit(absl::Duration timeout) {
  return std::clamp(timeout / 2, absl::Seconds(2), absl::Seconds(10));
}

absl::Status StartHeartbeats(MPI_Comm world, std::vector<int> watched, absl::Time deadline,
                             absl::Duration timeout) {
  std::lock_guard<std::mutex> guard(g_mu);
  if (g_started) return absl::OkStatus();
  g_started = true;
  auto* h = new Heartbeats();
  MPI_Request request = MPI_REQUEST_NULL;
  int rc;
  {
    MpiCallLock lock;
    rc = MPI_Comm_idup(world, &h->comm, &request);
  }
  if (rc != MPI_SUCCESS) return MpiError("CreateMpiCommunicator", "MPI_Comm_idup(heartbeats)", rc);
  // The dup is collective: poll it against the creation's deadline.
  int done = 0;
  while (!done) {
    {
      MpiCallLock lock;
      rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS) return MpiError("CreateMpiCommunicator", "MPI_Test(heartbeats)", rc);
    if (!done && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "CreateMpiCommunicator: the heartbeat communicator's MPI_Comm_idup did not complete "
          "within ",
          absl::FormatDuration(timeout), "; end the job with AbortJob"));
    }
    if (!done) absl::SleepFor(absl::Microseconds(100));
  }
  int world_size = 0;
  {
    MpiCallLock lock;
    MPI_Comm_set_errhandler(h->comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(h->comm, &world_size);
  }
  h->watched = std::move(watched);
  h->index_of.assign(world_size, -1);
  const int n = static_cast<int>(h->watched.size());
  h->last_beat = std::make_unique<std::atomic<int64_t>[]>(n);
  const int64_t start = absl::GetCurrentTimeNanos();
  h->last_poll.store(start);
  h->receives.assign(n, MPI_REQUEST_NULL);
  h->inbox.assign(n, 0);
  for (int i = 0; i < n; ++i) {
    h->index_of[h->watched[i]] = i;
    h->last_beat[i].store(start);
    MpiCallLock lock;
    MPI_Irecv(&h->inbox[i], 1, MPI_INT64_T, h->watched[i], kHeartbeatTag, h->comm, &h->receives[i]);
  }
  h->thread = std::thread(Run, h);
  g_heartbeats = h;
  return absl::OkStatus();
}

std::optional<absl::Duration> SilenceOf(int world_rank) {
  Heartbeats* h;
  {
    std::lock_guard<std::mutex> guard(g_mu);
    h = g_heartbeats;
  }
  if (h == nullptr || world_rank < 0 || world_rank >= static_cast<int>(h->index_of.size())) {
    return std::nullopt;
  }
  const int i = h->index_of[world_rank];
  if (i < 0) return std::nullopt;
  // Counted up to this rank's last look, so that a thread of ours that the
  // scheduler kept from looking does not make a peer seem silent.
  const int64_t silent = h->last_poll.load() - h->last_beat[i].load();
  return absl::Nanoseconds(std::max<int64_t>(0, silent));
}

void StopHeartbeats() {
  Heartbeats* h;
  {
    std::lock_guard<std::mutex> guard(g_mu);
    h = g_heartbeats;
    g_heartbeats = nullptr;
    if (h != nullptr) g_stopped = h;
  }
  if (h == nullptr) return;
  h->stop.store(true);
  h->thread.join();
  // Every rank stops beating before it enters this barrier; until the
  // barrier completes (and a little after) the beats still arriving are
  // received, so none is left unmatched inside MPI at MPI_Finalize. The
  // wait has no limit: a rank that finishes later (rank 0 of mlp_demo runs
  // its one-rank baseline first) keeps beating until it comes, and
  // MPI_Finalize would wait for it all the same; a peer that died instead
  // ends the job through the launcher. (An active nonblocking barrier must
  // not be freed either: Open MPI fails MPI_Request_free on it.)
  const int n = static_cast<int>(h->watched.size());
  std::vector<int> indices(n);
  MPI_Request barrier = MPI_REQUEST_NULL;
  {
    MpiCallLock lock;
    MPI_Ibarrier(h->comm, &barrier);
  }
  absl::Time drained = absl::InfiniteFuture();
  while (absl::Now() < drained) {
    {
      MpiCallLock lock;
      int done = 0;
      if (barrier != MPI_REQUEST_NULL) MPI_Test(&barrier, &done, MPI_STATUS_IGNORE);
      if (done && drained == absl::InfiniteFuture()) {
        drained = absl::Now() + absl::Milliseconds(100);
      }
      int completed = 0;
      if (MPI_Testsome(n, h->receives.data(), &completed, indices.data(), MPI_STATUSES_IGNORE) ==
              MPI_SUCCESS &&
          completed != MPI_UNDEFINED) {
        for (int k = 0; k < completed; ++k) {
          const int i = indices[k];
          MPI_Irecv(&h->inbox[i], 1, MPI_INT64_T, h->watched[i], kHeartbeatTag, h->comm,
                    &h->receives[i]);
        }
      }
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  MpiCallLock lock;
  AbandonRequests(h->receives, [](size_t) { return true; });
  // Freed before MPI_Finalize (MPI completes what is still in flight first).
  MPI_Comm_free(&h->comm);
  // `h` stays allocated: a receive let go unfinished may still be written.
}

}  // namespace internal
}  // namespace zeroshard
