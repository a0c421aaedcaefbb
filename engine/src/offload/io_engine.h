// The asynchronous transfers behind SwapFiles: tickets, each split into
// pieces of at most kIoPieceBytes, run by io_uring or by a pool of threads.
// Both backends report a piece's end through FinishPiece, so tickets, their
// first error and Wait are written once here. A request may carry a hook
// (SwapFiles' checksums) that runs on each piece's bytes in the thread that
// completed the piece, before FinishPiece.
#ifndef ZEROSHARD_OFFLOAD_IO_ENGINE_H_
#define ZEROSHARD_OFFLOAD_IO_ENGINE_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/src/offload/swap_files.h"

namespace zeroshard::internal {

// A ticket's pieces: small enough that the pool's threads share one large
// transfer and io_uring keeps several requests of it in flight, large enough
// that a system call moves a few MiB.
inline constexpr int64_t kIoPieceBytes = int64_t{4} << 20;

// One transfer between host memory and an open file.
struct IoRequest {
  bool write = false;
  int fd = -1;
  const std::string* path = nullptr;  // for messages; outlives the transfer
  char* host = nullptr;
  int64_t file_offset = 0;
  int64_t bytes = 0;
  // Null: none. Run once per piece, on the whole piece, when its transfer
  // ended, in the thread that completed it (a pool thread, or io_uring's
  // completion thread), so that it overlaps the caller's work and the other
  // pieces' I/O. A read's runs only when all of its bytes arrived; its
  // error becomes the ticket's. A write's runs whatever the outcome (the
  // host bytes are what the caller meant the file to hold); its error
  // counts where the transfer had none. Outlives the transfer; called from
  // several threads at once.
  const IoPieceHook* hook = nullptr;
};

// A piece of a ticket and how far it got (short transfers resume from
// `done`).
struct IoPiece {
  int64_t ticket = 0;
  IoRequest request;
  int64_t done = 0;
};

// Wait's error for a transfer the system refused: the file, the direction,
// the offset and bytes, the call and its error.
absl::Status IoPieceError(const IoPiece& piece, const char* call, int error_number);
// After a transfer moved less than asked: an error naming the file's
// present size when the file no longer covers the piece (truncated), OK
// when it does (the caller resumes). A write that moved nothing is an error.
absl::Status CheckShortTransfer(const IoPiece& piece, int64_t moved);
// A piece's end as the ticket hears of it: the transfer's `status`, then the
// request's hook (IoRequest::hook says when it runs and what counts).
absl::Status EndOfPiece(const IoPiece& piece, absl::Status status);

class IoEngine {
 public:
  // io_uring when `allow_io_uring`, liburing was built in and the ring
  // initialises; else a pool of `threads` threads. Never fails: the pool
  // always works, and describe() gives the reason io_uring did not run.
  static std::unique_ptr<IoEngine> Create(bool allow_io_uring, int threads);
  virtual ~IoEngine();

  // Starts `request` (bytes may be 0: the ticket is complete at once).
  int64_t Issue(const IoRequest& request);
  absl::Status Wait(int64_t ticket);
  absl::Status WaitAll();
  virtual IoBackend backend() const = 0;
  virtual std::string describe() const = 0;

 protected:
  IoEngine() = default;
  // Hands the pieces to the backend; called without mu_.
  virtual void StartPieces(std::vector<IoPiece> pieces) = 0;
  // A piece ended with `status` (from any thread).
  void FinishPiece(int64_t ticket, const absl::Status& status);
  // Blocks until no piece is in flight (the backends' destructors, before
  // they stop their threads).
  void Drain();

 private:
  struct TicketState {
    int64_t pieces_left = 0;
    absl::Status status;
  };
  std::mutex mu_;
  std::condition_variable done_;
  std::map<int64_t, TicketState> tickets_;  // ordered: WaitAll reports the first issued error
  int64_t next_ticket_ = 1;
  int64_t pieces_in_flight_ = 0;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_OFFLOAD_IO_ENGINE_H_
