// The NVMe tier's files: one scratch file per offloaded tensor of a rank,
// read and written asynchronously in aligned chunks.
//
// File format: <dir>/zeroshard-swap.rank<R>.<name>.bin is one header page
// (kSwapAlignment bytes of text, "zeroshard swap file v1" then "key value"
// lines: pid, host, boot_id, start_time, rank, tensor, bytes; zero padded),
// then the tensor's bytes rounded up to kSwapAlignment, reserved with
// fallocate. The owner holds flock(LOCK_EX) on the file while it lives.
// Stale rules, checked before anything is created: a file without the
// header's first line is foreign and refused; one whose lock is held, or
// whose owner (same host and boot, that pid with that start time) still runs,
// is refused naming the pid; any other file of ours is stale (its run died)
// and is replaced with a line on stderr. A normal end removes the files.
// Backends: io_uring (a completion thread reaps and resubmits) where liburing
// was built in and io_uring_queue_init succeeds, else a pool of threads
// running pread/pwrite loops; describe() says which ran and why.
#ifndef ZEROSHARD_OFFLOAD_SWAP_FILES_H_
#define ZEROSHARD_OFFLOAD_SWAP_FILES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zeroshard::internal {

class IoEngine;

enum class IoBackend { kIoUring, kThreadPool };
// "io_uring" or "thread pool".
const char* IoBackendName(IoBackend backend);

// One offloaded tensor: its name (in the file name: letters, digits, '_',
// '-' and '.') and its size in bytes.
struct SwapTensor {
  std::string name;
  int64_t bytes = 0;
};

struct SwapOptions {
  std::string dir;             // --offload-dir; must exist and be a directory
  int rank = 0;                // in the file names
  int io_threads = 2;          // the thread pool's size (>= 1)
  bool allow_io_uring = true;  // false forces the thread pool
  bool direct = true;          // O_DIRECT, buffered where the file system refuses it
};

// Offsets, sizes and host buffers of every transfer are multiples of this;
// it is also the header's size.
inline constexpr int64_t kSwapAlignment = 4096;

// `bytes` rounded up to kSwapAlignment.
int64_t RoundUpToSwapAlignment(int64_t bytes);

// The swap files of one rank. Create and the destructor from any thread;
// the I/O calls from one thread at a time (the engine's), while the I/O
// itself runs in the kernel (io_uring) or in the pool's threads.
class SwapFiles {
 public:
  using Ticket = int64_t;

  // Bytes the files take on disk: per tensor, one header page plus the
  // tensor's bytes rounded up to kSwapAlignment.
  static int64_t DiskBytes(const std::vector<SwapTensor>& tensors);

  // Checks the names, the directory, the files already there (the stale
  // rules above) and the free space (statvfs, counting the stale files'
  // blocks as free), all before creating anything; then creates the files,
  // reserves their space and locks them. Errors: InvalidArgument (names,
  // sizes, options), NotFound / FailedPrecondition (directory; a foreign or
  // live file, named), ResourceExhausted (the directory, the bytes needed and
  // the bytes free), Internal (a system call, named with its error).
  static absl::StatusOr<std::unique_ptr<SwapFiles>> Create(const SwapOptions& options,
                                                           const std::vector<SwapTensor>& tensors);
  // Waits for the I/O in flight, then closes and removes the files (only
  // those that still are the files it created).
  ~SwapFiles();
  SwapFiles(const SwapFiles&) = delete;
  SwapFiles& operator=(const SwapFiles&) = delete;

  // Starts a transfer of `bytes` at byte `offset` of tensor `tensor`'s data
  // between the file and host memory. `offset`, `bytes` and the host pointer
  // must be multiples of kSwapAlignment and the range within the tensor's
  // rounded size, else InvalidArgument. The host memory must stay valid
  // until Wait. A short read (the file truncated) or a failed transfer is an
  // error of Wait naming the file, the offset and the bytes.
  absl::StatusOr<Ticket> ReadAsync(int tensor, int64_t offset, void* dst, int64_t bytes);
  absl::StatusOr<Ticket> WriteAsync(int tensor, int64_t offset, const void* src, int64_t bytes);
  // Blocks until the ticket's transfer ends and returns its status; a ticket
  // is waited for once (InvalidArgument for one unknown or already waited).
  absl::Status Wait(Ticket ticket);
  // Waits for every ticket not waited for yet; returns the first error.
  absl::Status WaitAll();
  absl::Status Read(int tensor, int64_t offset, void* dst, int64_t bytes);
  absl::Status Write(int tensor, int64_t offset, const void* src, int64_t bytes);

  // Two system calls per file: each path still names the file we created
  // (same inode and device) and has its full size; FailedPrecondition naming
  // the file ("removed", "replaced" or "truncated to N bytes, expected M").
  absl::Status CheckFiles() const;

  IoBackend backend() const;
  // "io_uring (queue depth 32), O_DIRECT" or "thread pool of 2
  // (io_uring_queue_init: Operation not permitted), buffered I/O (O_DIRECT:
  // Invalid argument)".
  std::string describe() const;
  const std::string& path(int tensor) const { return files_[tensor].path; }
  int64_t bytes(int tensor) const { return files_[tensor].bytes; }
  int64_t rounded_bytes(int tensor) const { return RoundUpToSwapAlignment(files_[tensor].bytes); }
  int num_tensors() const { return static_cast<int>(files_.size()); }
  const std::string& dir() const { return dir_; }

 private:
  struct File {
    std::string path;
    int64_t bytes = 0;
    int fd = -1;
    uint64_t dev = 0;
    uint64_t ino = 0;
  };
  SwapFiles() = default;
  absl::StatusOr<Ticket> Start(bool write, int tensor, int64_t offset, void* host, int64_t bytes);

  std::string dir_;
  std::vector<File> files_;
  std::unique_ptr<IoEngine> io_;
  std::string storage_note_;  // "O_DIRECT" or "buffered I/O (...)", plus any fallocate note
};

// Host memory aligned to kSwapAlignment (posix_memalign), freed on
// destruction; the size is rounded up to kSwapAlignment.
class AlignedBuffer {
 public:
  static absl::StatusOr<AlignedBuffer> Allocate(int64_t bytes);
  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  ~AlignedBuffer();
  void* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  int64_t size_ = 0;
};

// One sequential pass over tensor `tensor`'s rounded size in chunks of
// `chunk_bytes` through SwapFiles' own path, `in_flight` chunks at a time
// (`buf` holds chunk_bytes * in_flight bytes, aligned): the disk's time for
// those bytes, for the offload benchmark. Returns seconds.
absl::StatusOr<double> MeasureSequentialSeconds(SwapFiles& files, int tensor, void* buf,
                                                int64_t chunk_bytes, bool write, int in_flight = 2);

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_OFFLOAD_SWAP_FILES_H_
