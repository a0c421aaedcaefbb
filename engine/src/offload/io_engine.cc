#include "engine/src/offload/io_engine.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

#if ZS_HAVE_IO_URING
#include <liburing.h>
#endif

namespace zeroshard::internal {
namespace {

const char* Direction(const IoRequest& request) { return request.write ? "write" : "read"; }

// The piece's place in its file, for messages.
std::string Where(const IoPiece& piece) {
  const IoRequest& r = piece.request;
  return absl::StrCat("swap file ", *r.path, ": ", Direction(r), " of ", r.bytes,
                      " bytes at file offset ", r.file_offset);
}

}  // namespace

absl::Status IoPieceError(const IoPiece& piece, const char* call, int error_number) {
  return absl::InternalError(
      absl::StrCat(Where(piece), " failed after ", piece.done, " bytes (", call, ": ",
                   std::strerror(error_number),
                   "); the optimizer state in it is lost: restart from the last "
                   "checkpoint, with --offload-dir on a healthy drive"));
}

absl::Status EndOfPiece(const IoPiece& piece, absl::Status status) {
  const IoRequest& r = piece.request;
  if (r.hook == nullptr || (!r.write && !status.ok())) return status;
  absl::Status hooked = (*r.hook)(r.file_offset, r.host, r.bytes);
  return status.ok() ? hooked : status;
}

absl::Status CheckShortTransfer(const IoPiece& piece, int64_t moved) {
  const IoRequest& r = piece.request;
  const int64_t end = r.file_offset + r.bytes;
  struct stat st;
  if (fstat(r.fd, &st) != 0) return IoPieceError(piece, "fstat", errno);
  if (!r.write && st.st_size < end) {
    return absl::DataLossError(absl::StrCat(
        Where(piece), " came back short: the file is ", st.st_size, " bytes, the read needs ", end,
        "; the file was truncated while this run used it, so the optimizer state in it is "
        "lost: restart from the last checkpoint and keep other programs off --offload-dir"));
  }
  if (r.write && moved == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Where(piece), " wrote nothing after ", piece.done,
                     " bytes (the file system is full or the file was changed); restart from the "
                     "last checkpoint"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Tickets.

IoEngine::~IoEngine() = default;

int64_t IoEngine::Issue(const IoRequest& request) {
  std::vector<IoPiece> pieces;
  for (int64_t at = 0; at < request.bytes; at += kIoPieceBytes) {
    IoPiece piece;
    piece.request = request;
    piece.request.host = request.host + at;
    piece.request.file_offset = request.file_offset + at;
    piece.request.bytes = std::min(kIoPieceBytes, request.bytes - at);
    pieces.push_back(piece);
  }
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    tickets_[ticket].pieces_left = static_cast<int64_t>(pieces.size());
    pieces_in_flight_ += static_cast<int64_t>(pieces.size());
  }
  for (IoPiece& piece : pieces) piece.ticket = ticket;
  if (!pieces.empty()) StartPieces(std::move(pieces));
  return ticket;
}

void IoEngine::FinishPiece(int64_t ticket, const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  TicketState& state = tickets_[ticket];
  if (state.status.ok() && !status.ok()) state.status = status;
  --state.pieces_left;
  --pieces_in_flight_;
  done_.notify_all();
}

absl::Status IoEngine::Wait(int64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("swap I/O ticket ", ticket,
                     " is unknown or was already waited for (wait once per ticket)"));
  }
  done_.wait(lock, [&] { return it->second.pieces_left == 0; });
  absl::Status status = it->second.status;
  tickets_.erase(it);
  return status;
}

absl::Status IoEngine::WaitAll() {
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pieces_in_flight_ == 0; });
  absl::Status first;
  for (const auto& [ticket, state] : tickets_) {
    if (first.ok() && !state.status.ok()) first = state.status;
  }
  tickets_.clear();
  return first;
}

void IoEngine::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pieces_in_flight_ == 0; });
}

namespace {

// ---------------------------------------------------------------------------
// The thread pool: pread/pwrite loops.

absl::Status RunPieceBlocking(IoPiece& piece) {
  const IoRequest& r = piece.request;
  while (piece.done < r.bytes) {
    const size_t want = static_cast<size_t>(r.bytes - piece.done);
    const off_t at = static_cast<off_t>(r.file_offset + piece.done);
    const ssize_t n = r.write ? pwrite(r.fd, r.host + piece.done, want, at)
                              : pread(r.fd, r.host + piece.done, want, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoPieceError(piece, r.write ? "pwrite" : "pread", errno);
    }
    if (static_cast<size_t>(n) < want) {
      absl::Status short_transfer = CheckShortTransfer(piece, n);
      if (!short_transfer.ok()) return short_transfer;
      if (n == 0) {
        // A read of nothing from a file that covers the range: not an EOF we
        // can explain; never hand back the buffer's old bytes as data.
        return IoPieceError(piece, "pread (0 bytes)", EIO);
      }
    }
    piece.done += n;
  }
  return absl::OkStatus();
}

class ThreadPoolEngine final : public IoEngine {
 public:
  ThreadPoolEngine(int threads, std::string why_not_io_uring)
      : why_not_io_uring_(std::move(why_not_io_uring)) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~ThreadPoolEngine() override {
    Drain();
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stop_ = true;
    }
    queue_cv_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }
  IoBackend backend() const override { return IoBackend::kThreadPool; }
  std::string describe() const override {
    return absl::StrCat("thread pool of ", threads_.size(), " (", why_not_io_uring_, ")");
  }

 protected:
  void StartPieces(std::vector<IoPiece> pieces) override {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      for (IoPiece& piece : pieces) queue_.push_back(std::move(piece));
    }
    queue_cv_.notify_all();
  }

 private:
  void Run() {
    while (true) {
      IoPiece piece;
      {
        std::unique_lock<std::mutex> lock(queue_mu_);
        queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        piece = std::move(queue_.front());
        queue_.pop_front();
      }
      FinishPiece(piece.ticket, EndOfPiece(piece, RunPieceBlocking(piece)));
    }
  }

  const std::string why_not_io_uring_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<IoPiece> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

#if ZS_HAVE_IO_URING
// ---------------------------------------------------------------------------
// io_uring: the caller's thread submits; a completion thread reaps, resumes
// short transfers and submits what waited for room. Both submit under
// submit_mu_ (liburing's submission side is single-producer); only the
// completion thread touches the completion queue. At most depth_ requests
// are in flight, so the completion queue (twice the depth) cannot overflow.

constexpr unsigned kUringDepth = 32;

class UringEngine final : public IoEngine {
 public:
  // The engine, or null with the reason in `why_not`.
  static std::unique_ptr<UringEngine> TryCreate(std::string* why_not) {
    std::unique_ptr<UringEngine> engine(new UringEngine());
    const int ret = io_uring_queue_init(kUringDepth, &engine->ring_, 0);
    if (ret != 0) {
      *why_not = absl::StrCat("io_uring_queue_init: ", std::strerror(-ret));
      return nullptr;
    }
    engine->reaper_ = std::thread([e = engine.get()] { e->Reap(); });
    return engine;
  }
  ~UringEngine() override {
    if (!reaper_.joinable()) return;  // the ring never initialised
    Drain();
    {
      // A NOP with no piece tells the completion thread to stop.
      std::lock_guard<std::mutex> lock(submit_mu_);
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      while (sqe == nullptr) {
        io_uring_submit(&ring_);
        sqe = io_uring_get_sqe(&ring_);
      }
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);
      while (io_uring_submit(&ring_) < 0) {
      }
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }
  IoBackend backend() const override { return IoBackend::kIoUring; }
  std::string describe() const override {
    return absl::StrCat("io_uring (queue depth ", kUringDepth, ")");
  }

 protected:
  void StartPieces(std::vector<IoPiece> pieces) override {
    std::lock_guard<std::mutex> lock(submit_mu_);
    for (IoPiece& piece : pieces) pending_.push_back(std::make_unique<IoPiece>(std::move(piece)));
    SubmitLocked();
  }

 private:
  UringEngine() = default;

  void SubmitLocked() {
    bool queued = false;
    while (in_flight_ < static_cast<int>(kUringDepth) && !pending_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      IoPiece* piece = pending_.front().release();
      pending_.pop_front();
      const IoRequest& r = piece->request;
      const unsigned want = static_cast<unsigned>(r.bytes - piece->done);
      const uint64_t at = static_cast<uint64_t>(r.file_offset + piece->done);
      if (r.write) {
        io_uring_prep_write(sqe, r.fd, r.host + piece->done, want, at);
      } else {
        io_uring_prep_read(sqe, r.fd, r.host + piece->done, want, at);
      }
      io_uring_sqe_set_data(sqe, piece);
      ++in_flight_;
      queued = true;
    }
    if (!queued && io_uring_sq_ready(&ring_) == 0) return;
    // EINTR: again. EAGAIN / EBUSY (no room for now): the entries stay in the
    // submission queue and the next completion submits them.
    int ret;
    do {
      ret = io_uring_submit(&ring_);
    } while (ret == -EINTR);
  }

  void Reap() {
    while (true) {
      io_uring_cqe* cqe = nullptr;
      const int ret = io_uring_wait_cqe(&ring_, &cqe);
      if (ret == -EINTR || ret == -EAGAIN) continue;
      if (ret < 0) {
        // The ring itself failed (not seen in practice): try again rather
        // than leave Wait blocked for ever, without spinning.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      std::unique_ptr<IoPiece> piece(static_cast<IoPiece*>(io_uring_cqe_get_data(cqe)));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (piece == nullptr) return;  // the destructor's NOP

      absl::Status status;
      bool finished = true;
      int64_t ticket;
      {
        // The piece was written under submit_mu_ by whichever thread
        // submitted it; reading it under the lock orders the two for the
        // language (the ring orders them only in the kernel's eyes).
        std::lock_guard<std::mutex> lock(submit_mu_);
        --in_flight_;
        if (res == -EINTR || res == -EAGAIN) {
          finished = false;
        } else if (res < 0) {
          status =
              IoPieceError(*piece, piece->request.write ? "io_uring write" : "io_uring read", -res);
        } else {
          if (res < piece->request.bytes - piece->done) {
            status = CheckShortTransfer(*piece, res);
            if (status.ok() && res == 0) {
              status = IoPieceError(*piece, "io_uring read (0 bytes)", EIO);
            }
          }
          piece->done += res;
          finished = !status.ok() || piece->done == piece->request.bytes;
        }
        ticket = piece->ticket;
        if (!finished) pending_.push_front(std::move(piece));
        SubmitLocked();
      }
      // The hook outside submit_mu_: the caller's submissions need not wait
      // for it.
      if (finished) FinishPiece(ticket, EndOfPiece(*piece, status));
    }
  }

  io_uring ring_{};
  std::mutex submit_mu_;
  std::deque<std::unique_ptr<IoPiece>> pending_;
  int in_flight_ = 0;
  std::thread reaper_;
};
#endif  // ZS_HAVE_IO_URING

}  // namespace

std::unique_ptr<IoEngine> IoEngine::Create(bool allow_io_uring, int threads) {
  std::string why_not;
  if (!allow_io_uring) {
    why_not = "io_uring not requested";
  } else {
#if ZS_HAVE_IO_URING
    if (std::unique_ptr<UringEngine> engine = UringEngine::TryCreate(&why_not)) return engine;
#else
    why_not = "built without liburing: install liburing-dev and rebuild";
#endif
  }
  return std::make_unique<ThreadPoolEngine>(threads, why_not);
}

}  // namespace zeroshard::internal
