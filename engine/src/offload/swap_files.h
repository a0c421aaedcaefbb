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
//
// Checksums (SwapOptions::verify, on by default; issue 34): the bytes on
// disk are checked against what this run wrote, so swap data damaged in
// place (another program, a failing drive) stops the step instead of being
// trained on. Each tensor has one CRC-32C (kernels/cpu/crc32c.h, SSE4.2)
// per kSwapAlignment page of its rounded size, kept in host memory and
// never in the file (4 bytes per 4 KiB: a copy on the same disk could be
// damaged with the data). A fresh page's is the CRC of a zero page
// (fallocate's blocks read as zeros). The CRCs run in the I/O threads (a
// pool thread, or io_uring's completion thread) as each piece of a transfer
// ends, not in the caller's: a write's pages' CRCs are computed from the
// source buffer (unchanged until Wait) and stored whatever the write's
// outcome, before its Wait returns. The CRC then always describes the bytes
// the caller meant to be there, so a write that fails or tears leaves
// pages whose next read is an error, never a page that passes with stale
// bytes. Every read is checked page by page before its Wait returns; a
// mismatch is DataLoss naming the file, the tensor and the file offset of
// the first bad page (header included, as `dd seek=` counts). The header page's CRC from Create is
// compared by CheckFiles, which re-reads the header (one 4 KiB pread per file). The cost:
// docs/offload.md, "Checksums" (perf/runtime/offload_bench).
#ifndef ZEROSHARD_OFFLOAD_SWAP_FILES_H_
#define ZEROSHARD_OFFLOAD_SWAP_FILES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zeroshard::internal {

class IoEngine;
// Run by the I/O threads on `bytes` bytes of host memory that were read
// from, or written to, file offset `file_offset` (IoRequest::hook).
using IoPieceHook =
    std::function<absl::Status(int64_t file_offset, const char* host, int64_t bytes)>;

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
  // CRC-32C of every page, checked on every read and by CheckFiles (the
  // header). false only for a benchmark's baseline: damage then goes unseen.
  bool verify = true;
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
  // (and a write's unchanged) until Wait; transfers in flight at once must
  // not share a page. A short read (the file truncated) or a failed transfer
  // is an error of Wait naming the file, the offset and the bytes. With
  // verify, a read whose bytes differ from what this run last wrote there
  // (CRC-32C per page) is DataLoss of Wait naming the file, the tensor and
  // the file offset of the first bad page; the bytes in `dst` are then not
  // to be used.
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
  // With verify, a third: the header page is read back and its CRC-32C
  // compared with the one written at Create; DataLoss naming the file and
  // "header page (offset 0)" when they differ. Not while a transfer is in
  // flight to the same file (the engine calls it between steps).
  absl::Status CheckFiles() const;

  IoBackend backend() const;
  // "io_uring (queue depth 32), O_DIRECT" or "thread pool of 2
  // (io_uring_queue_init: Operation not permitted), buffered I/O (O_DIRECT:
  // Invalid argument)".
  std::string describe() const;
  const std::string& path(int tensor) const { return files_[tensor].path; }
  const std::string& name(int tensor) const { return files_[tensor].name; }
  bool verify() const { return verify_; }
  int64_t bytes(int tensor) const { return files_[tensor].bytes; }
  int64_t rounded_bytes(int tensor) const { return RoundUpToSwapAlignment(files_[tensor].bytes); }
  int num_tensors() const { return static_cast<int>(files_.size()); }
  const std::string& dir() const { return dir_; }

 private:
  struct File {
    std::string path;
    std::string name;  // the tensor's
    int64_t bytes = 0;
    int fd = -1;
    uint64_t dev = 0;
    uint64_t ino = 0;
    // verify: the CRC-32C of each data page as last written (empty without)
    // and of the header page; the hooks that check a read against them and
    // record a write's. IoEngine runs the hooks in its own threads, several
    // at once: each element belongs to the one transfer in flight on its
    // page, never to two at once (ReadAsync's contract).
    std::vector<uint32_t> page_crcs;
    uint32_t header_crc = 0;
    IoPieceHook check_read, record_write;
  };
  SwapFiles() = default;
  absl::StatusOr<Ticket> Start(bool write, int tensor, int64_t offset, void* host, int64_t bytes);
  // The hooks of tensor `tensor` on `bytes` at `file_offset` (header
  // included): a read's against page_crcs, and a write's into them.
  absl::Status VerifyPages(int tensor, int64_t file_offset, const char* host, int64_t bytes) const;
  void RecordPages(int tensor, int64_t file_offset, const char* host, int64_t bytes);

  std::string dir_;
  bool verify_ = true;
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
