#include "engine/src/offload/swap_files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/offload/io_engine.h"
#include "kernels/cpu/crc32c.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

constexpr char kMagicLine[] = "zeroshard swap file v1";

std::string SystemError(const std::string& what, const std::string& path, int error_number) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(error_number));
}

std::string HumanBytes(int64_t bytes) {
  const double gib = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
  if (gib >= 1.0) return absl::StrFormat("%.2f GiB", gib);
  return absl::StrFormat("%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

std::string TrimmedFileLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 of /proc/<pid>/stat (clock ticks after boot): with the pid and
// the boot id it names one process, whatever pids are reused since.
std::string ProcessStartTime(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos) return "";
  std::istringstream fields(all.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return field;
  }
  return "";
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// Who wrote a swap file.
struct Owner {
  std::string pid, host, boot_id, start_time;
};

Owner ThisProcess() {
  return {std::to_string(getpid()), HostName(), TrimmedFileLine("/proc/sys/kernel/random/boot_id"),
          ProcessStartTime("self")};
}

std::string HeaderText(const Owner& owner, int rank, const SwapTensor& tensor) {
  return absl::StrCat(kMagicLine, "\npid ", owner.pid, "\nhost ", owner.host, "\nboot_id ",
                      owner.boot_id, "\nstart_time ", owner.start_time, "\nrank ", rank,
                      "\ntensor ", tensor.name, "\nbytes ", tensor.bytes, "\n");
}

// The owner of a header page, or nullopt when it is not ours (no magic).
std::optional<Owner> ParseHeader(const std::string& page) {
  std::istringstream in(page);
  std::string line;
  if (!std::getline(in, line) || line != kMagicLine) return std::nullopt;
  Owner owner;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string key = line.substr(0, space), value = line.substr(space + 1);
    if (key == "pid") owner.pid = value;
    if (key == "host") owner.host = value;
    if (key == "boot_id") owner.boot_id = value;
    if (key == "start_time") owner.start_time = value;
  }
  return owner;
}

// Whether the process that wrote the header still runs on this machine:
// same host and boot, the pid exists and started when the header says.
bool OwnerRunsHere(const Owner& owner, const Owner& self) {
  if (owner.pid.empty() || owner.host != self.host || owner.boot_id != self.boot_id) return false;
  const long pid = std::strtol(owner.pid.c_str(), nullptr, 10);
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  const std::string start = ProcessStartTime(owner.pid);
  // An unreadable start time (another pid namespace's /proc): the pid
  // exists, so do not call it dead.
  return start.empty() || start == owner.start_time;
}

// A file of ours whose run died: replaced.
struct StaleFile {
  std::string path;
  Owner owner;
  int64_t disk_bytes = 0;
};

// The verdict on what is at `path` before Create: nothing, or a stale file
// (added to `stale`), or an error (foreign, live).
absl::Status InspectExisting(const std::string& path, const Owner& self,
                             std::vector<StaleFile>* stale) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(SystemError("cannot stat swap file", path, errno));
  }
  const std::string remedy = "remove it or choose another --offload-dir";
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "swap file path ", path, " is taken by something that is not a regular file; ", remedy));
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::InternalError(SystemError("cannot open existing swap file", path, errno));
  }
  std::string page(static_cast<size_t>(kSwapAlignment), '\0');
  ssize_t got = 0;
  while (got < kSwapAlignment) {
    const ssize_t n = pread(fd, page.data() + got, kSwapAlignment - got, got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
  }
  page.resize(static_cast<size_t>(got));
  const std::optional<Owner> owner = ParseHeader(page);
  if (!owner) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("swap file path ", path,
                     " holds a file zeroshard did not write (no swap header); ", remedy));
  }
  // The owner holds LOCK_EX while it lives; taking it means it is gone
  // (close releases the probe's lock).
  const bool locked_by_owner = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);
  if (locked_by_owner || OwnerRunsHere(*owner, self)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "swap file ", path, " belongs to a running process (pid ", owner->pid, " on ", owner->host,
        "): another run uses this --offload-dir with the same rank; stop it or choose another "
        "--offload-dir"));
  }
  stale->push_back({path, *owner, static_cast<int64_t>(st.st_blocks) * 512});
  return absl::OkStatus();
}

absl::Status ValidateTensors(const std::vector<SwapTensor>& tensors) {
  std::set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SwapTensor& t = tensors[i];
    bool name_ok = !t.name.empty();
    for (char c : t.name) {
      name_ok = name_ok &&
                (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
    }
    if (!name_ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("swap tensor ", i, " name \"", t.name,
                       "\": use letters, digits, '_', '-' and '.' (it is in a "
                       "file name)"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("swap tensor name \"", t.name, "\" is given twice"));
    }
    if (t.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("swap tensor \"", t.name, "\": bytes ", t.bytes, " < 0"));
    }
  }
  return absl::OkStatus();
}

// Writes all of `bytes` at `offset` (header pages), retrying EINTR and
// short writes.
absl::Status WriteAll(int fd, const std::string& path, const char* bytes, int64_t size,
                      int64_t offset) {
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = pwrite(fd, bytes + done, static_cast<size_t>(size - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(SystemError("cannot write the header of swap file", path, errno));
    }
    done += n;
  }
  return absl::OkStatus();
}

// The CRC-32C of a page of zeros: a fresh page's (fallocate's blocks read
// as zeros).
uint32_t ZeroPageCrc() {
  static const uint32_t crc = [] {
    const std::vector<char> zeros(static_cast<size_t>(kSwapAlignment), 0);
    return kernels::Crc32c(zeros.data(), zeros.size());
  }();
  return crc;
}

// What a checksum mismatch means and what to do, for every such error.
constexpr char kDamagedRemedy[] =
    ": the swap data was changed on disk after this run wrote it (another program wrote into "
    "the file, or the drive returned bad data). The optimizer state is damaged and the run "
    "cannot continue from it: resume from the last checkpoint, check the drive (dmesg, "
    "smartctl) and keep other programs off --offload-dir";

}  // namespace

const char* IoBackendName(IoBackend backend) {
  return backend == IoBackend::kIoUring ? "io_uring" : "thread pool";
}

int64_t RoundUpToSwapAlignment(int64_t bytes) {
  return (bytes + kSwapAlignment - 1) / kSwapAlignment * kSwapAlignment;
}

int64_t SwapFiles::DiskBytes(const std::vector<SwapTensor>& tensors) {
  int64_t total = 0;
  for (const SwapTensor& t : tensors) total += kSwapAlignment + RoundUpToSwapAlignment(t.bytes);
  return total;
}

absl::StatusOr<std::unique_ptr<SwapFiles>> SwapFiles::Create(
    const SwapOptions& options, const std::vector<SwapTensor>& tensors) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("--offload-dir is empty: name a directory");
  }
  if (options.rank < 0 || options.io_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("swap files: rank ", options.rank,
                                                   " and io_threads ", options.io_threads,
                                                   " (need rank >= 0, io_threads >= 1)"));
  }
  ZS_RETURN_IF_ERROR(ValidateTensors(tensors));
  struct stat dir_stat;
  if (stat(options.dir.c_str(), &dir_stat) != 0) {
    const std::string message =
        absl::StrCat("--offload-dir ", options.dir, ": ", std::strerror(errno),
                     "; create it (on a fast local drive) or choose another");
    return errno == ENOENT ? absl::NotFoundError(message) : absl::FailedPreconditionError(message);
  }
  if (!S_ISDIR(dir_stat.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--offload-dir ", options.dir, " is not a directory; name a directory"));
  }

  std::unique_ptr<SwapFiles> files(new SwapFiles());
  files->dir_ = options.dir;
  files->verify_ = options.verify;
  for (const SwapTensor& t : tensors) {
    File file;
    file.path =
        absl::StrCat(options.dir, "/zeroshard-swap.rank", options.rank, ".", t.name, ".bin");
    file.name = t.name;
    file.bytes = t.bytes;
    files->files_.push_back(file);
  }

  // Everything checked before anything is created or removed.
  const Owner self = ThisProcess();
  std::vector<StaleFile> stale;
  for (const File& file : files->files_)
    ZS_RETURN_IF_ERROR(InspectExisting(file.path, self, &stale));
  struct statvfs fs;
  if (statvfs(options.dir.c_str(), &fs) != 0) {
    return absl::InternalError(SystemError("statvfs of --offload-dir", options.dir, errno));
  }
  if ((fs.f_flag & ST_RDONLY) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "--offload-dir ", options.dir, " is on a read-only file system: the swap files of rank ",
        options.rank, " are written every step; choose a directory on a writable local drive"));
  }
  const int64_t needed = DiskBytes(tensors);
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  int64_t reclaimed = 0;
  for (const StaleFile& s : stale) reclaimed += s.disk_bytes;
  if (needed > free_bytes + reclaimed) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--offload-dir ", options.dir, ": the swap files of rank ", options.rank,
                     " need ", needed, " bytes (", HumanBytes(needed), "), the file system has ",
                     free_bytes, " bytes free (", HumanBytes(free_bytes), ")",
                     reclaimed > 0 ? absl::StrCat(" plus ", reclaimed, " in stale swap files") : "",
                     "; free space there, choose a bigger --offload-dir or offload less"));
  }
  for (const StaleFile& s : stale) {
    if (unlink(s.path.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(SystemError("cannot remove stale swap file", s.path, errno));
    }
    std::fprintf(
        stderr, "zeroshard: replaced stale swap file %s (written by pid %s on %s, which is gone)\n",
        s.path.c_str(), s.owner.pid.c_str(), s.owner.host.c_str());
  }

  ZS_ASSIGN_OR_RETURN(AlignedBuffer header, AlignedBuffer::Allocate(kSwapAlignment));
  std::string direct_note = options.direct ? "O_DIRECT" : "buffered I/O (O_DIRECT not requested)";
  std::string space_note;
  for (size_t i = 0; i < files->files_.size(); ++i) {
    File& file = files->files_[i];
    // The destructor removes what this loop created, should a later step fail.
    file.fd = open(file.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (file.fd < 0 && errno == EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat(
          "swap file ", file.path, " appeared while this run created its files: another run ",
          "uses this --offload-dir with the same rank; stop it or choose another --offload-dir"));
    }
    if (file.fd < 0) {
      const int error_number = errno;
      const std::string text = SystemError("cannot create swap file", file.path, error_number);
      if (error_number == EACCES || error_number == EPERM || error_number == EROFS) {
        return absl::PermissionDeniedError(
            absl::StrCat(text,
                         "; --offload-dir must be writable by this process: fix its permissions or "
                         "choose another --offload-dir"));
      }
      if (error_number == ENOSPC || error_number == EDQUOT) {
        return absl::ResourceExhaustedError(
            absl::StrCat(text, "; free space there or choose another --offload-dir"));
      }
      return absl::InternalError(text);
    }
    struct stat st;
    if (fstat(file.fd, &st) != 0) {
      return absl::InternalError(SystemError("fstat of swap file", file.path, errno));
    }
    file.dev = st.st_dev;
    file.ino = st.st_ino;
    if (flock(file.fd, LOCK_EX | LOCK_NB) != 0) {
      return absl::FailedPreconditionError(
          SystemError("another process locked the new swap file (two runs starting at once?)",
                      file.path, errno));
    }
    // O_DIRECT is set after creation: a file system that refuses it says so
    // here (EINVAL) without leaving a half-made file to clean up.
    if (options.direct) {
      const int flags = fcntl(file.fd, F_GETFL);
      if (flags < 0 || fcntl(file.fd, F_SETFL, flags | O_DIRECT) != 0) {
        direct_note = absl::StrCat("buffered I/O (O_DIRECT: ", std::strerror(errno), ")");
      }
    }
    const int64_t file_bytes = kSwapAlignment + RoundUpToSwapAlignment(file.bytes);
    // Reserve the blocks now, so that a full disk fails here and not in the
    // middle of a step; fallocate's blocks read as zeros.
    if (fallocate(file.fd, 0, 0, file_bytes) != 0) {
      const int error_number = errno;
      if (error_number == ENOSPC) {
        return absl::ResourceExhaustedError(
            absl::StrCat("--offload-dir ", options.dir, ": no space for swap file ", file.path,
                         " (", file_bytes, " bytes; ", needed, " for all of rank ", options.rank,
                         "); something else filled the disk after the check; free space there"));
      }
      if (error_number != EOPNOTSUPP) {
        return absl::InternalError(SystemError("fallocate of swap file", file.path, error_number));
      }
      if (ftruncate(file.fd, file_bytes) != 0) {
        return absl::InternalError(SystemError("ftruncate of swap file", file.path, errno));
      }
      space_note = absl::StrCat(", space not reserved (fallocate: ", std::strerror(error_number),
                                "; ftruncate)");
    }
    const std::string text = HeaderText(self, options.rank, tensors[i]);
    std::memset(header.data(), 0, static_cast<size_t>(kSwapAlignment));
    std::memcpy(header.data(), text.data(), std::min<size_t>(text.size(), kSwapAlignment));
    ZS_RETURN_IF_ERROR(
        WriteAll(file.fd, file.path, static_cast<const char*>(header.data()), kSwapAlignment, 0));
    if (options.verify) {
      file.header_crc = kernels::Crc32c(header.data(), static_cast<size_t>(kSwapAlignment));
      file.page_crcs.assign(
          static_cast<size_t>(RoundUpToSwapAlignment(file.bytes) / kSwapAlignment), ZeroPageCrc());
      // files_ is complete and never resized: the hooks' `this` and index
      // stay valid for the files' life.
      SwapFiles* self = files.get();
      const int tensor = static_cast<int>(i);
      file.check_read = [self, tensor](int64_t file_offset, const char* host, int64_t bytes) {
        return self->VerifyPages(tensor, file_offset, host, bytes);
      };
      file.record_write = [self, tensor](int64_t file_offset, const char* host, int64_t bytes) {
        self->RecordPages(tensor, file_offset, host, bytes);
        return absl::OkStatus();
      };
    }
  }
  files->storage_note_ = direct_note + space_note;
  files->io_ = IoEngine::Create(options.allow_io_uring, options.io_threads);
  return files;
}

SwapFiles::~SwapFiles() {
  if (io_ != nullptr) {
    io_->WaitAll().IgnoreError();
    io_.reset();
  }
  for (File& file : files_) {
    if (file.fd < 0) continue;
    // Remove the path only while it still names our file: one put there by
    // someone else since is theirs.
    struct stat st;
    if (stat(file.path.c_str(), &st) == 0 && st.st_dev == file.dev && st.st_ino == file.ino) {
      unlink(file.path.c_str());
    }
    close(file.fd);
  }
}

absl::StatusOr<SwapFiles::Ticket> SwapFiles::Start(bool write, int tensor, int64_t offset,
                                                   void* host, int64_t bytes) {
  if (tensor < 0 || tensor >= num_tensors()) {
    return absl::InvalidArgumentError(
        absl::StrCat("swap tensor ", tensor, " out of range (", num_tensors(), " swap files)"));
  }
  const File& file = files_[tensor];
  const int64_t limit = RoundUpToSwapAlignment(file.bytes);
  const uintptr_t address = reinterpret_cast<uintptr_t>(host);
  if (offset < 0 || bytes < 0 || offset % kSwapAlignment != 0 || bytes % kSwapAlignment != 0 ||
      address % kSwapAlignment != 0 || offset > limit || bytes > limit - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "swap file %s: %s of %d bytes at offset %d from host address %p: offset, bytes and the "
        "address must "
        "be multiples of %d and the range within the tensor's %d bytes (rounded up)",
        file.path, write ? "write" : "read", bytes, offset, host, kSwapAlignment, limit));
  }
  IoRequest request;
  request.write = write;
  request.fd = file.fd;
  request.path = &file.path;
  request.host = static_cast<char*>(host);
  request.file_offset = kSwapAlignment + offset;
  request.bytes = bytes;
  if (verify_) request.hook = write ? &file.record_write : &file.check_read;
  return io_->Issue(request);
}

absl::Status SwapFiles::VerifyPages(int tensor, int64_t file_offset, const char* host,
                                    int64_t bytes) const {
  const File& file = files_[tensor];
  const int64_t first_page = (file_offset - kSwapAlignment) / kSwapAlignment;
  for (int64_t at = 0; at < bytes; at += kSwapAlignment) {
    const uint32_t got = kernels::Crc32c(host + at, static_cast<size_t>(kSwapAlignment));
    const uint32_t want = file.page_crcs[static_cast<size_t>(first_page + at / kSwapAlignment)];
    if (got == want) continue;
    return absl::DataLossError(absl::StrFormat(
        "swap file %s (tensor %s): checksum mismatch in the page at file offset %d (%d bytes; "
        "byte %d of the tensor's data): crc32c 0x%08x read, 0x%08x written%s",
        file.path, file.name, file_offset + at, kSwapAlignment, file_offset + at - kSwapAlignment,
        got, want, kDamagedRemedy));
  }
  return absl::OkStatus();
}

absl::StatusOr<SwapFiles::Ticket> SwapFiles::ReadAsync(int tensor, int64_t offset, void* dst,
                                                       int64_t bytes) {
  return Start(false, tensor, offset, dst, bytes);
}

absl::StatusOr<SwapFiles::Ticket> SwapFiles::WriteAsync(int tensor, int64_t offset, const void* src,
                                                        int64_t bytes) {
  // The pool and io_uring only read `src` for a write.
  return Start(true, tensor, offset, const_cast<void*>(src), bytes);
}

void SwapFiles::RecordPages(int tensor, int64_t file_offset, const char* host, int64_t bytes) {
  // Whether the write succeeded or not: the CRC is of the bytes meant to be
  // there, so a failed or torn write fails the next read of its pages (a
  // CRC kept from before would pass the old bytes). `host` is unchanged
  // until Wait, so these are the bytes the disk got.
  File& file = files_[tensor];
  const int64_t first_page = (file_offset - kSwapAlignment) / kSwapAlignment;
  for (int64_t at = 0; at < bytes; at += kSwapAlignment) {
    file.page_crcs[static_cast<size_t>(first_page + at / kSwapAlignment)] =
        kernels::Crc32c(host + at, static_cast<size_t>(kSwapAlignment));
  }
}

absl::Status SwapFiles::Wait(Ticket ticket) { return io_->Wait(ticket); }
absl::Status SwapFiles::WaitAll() { return io_->WaitAll(); }

absl::Status SwapFiles::Read(int tensor, int64_t offset, void* dst, int64_t bytes) {
  ZS_ASSIGN_OR_RETURN(Ticket ticket, ReadAsync(tensor, offset, dst, bytes));
  return Wait(ticket);
}

absl::Status SwapFiles::Write(int tensor, int64_t offset, const void* src, int64_t bytes) {
  ZS_ASSIGN_OR_RETURN(Ticket ticket, WriteAsync(tensor, offset, src, bytes));
  return Wait(ticket);
}

absl::Status SwapFiles::CheckFiles() const {
  const std::string lost =
      "; the optimizer state in it is lost: restart from the last checkpoint and keep other "
      "programs off "
      "--offload-dir";
  for (const File& file : files_) {
    struct stat st;
    if (stat(file.path.c_str(), &st) != 0) {
      if (errno == ENOENT) {
        return absl::FailedPreconditionError(
            absl::StrCat("swap file ", file.path, " was removed", lost));
      }
      return absl::FailedPreconditionError(SystemError("cannot stat swap file", file.path, errno) +
                                           lost);
    }
    if (st.st_dev != file.dev || st.st_ino != file.ino) {
      return absl::FailedPreconditionError(
          absl::StrCat("swap file ", file.path, " was replaced by another file", lost));
    }
    const int64_t expected = kSwapAlignment + RoundUpToSwapAlignment(file.bytes);
    if (st.st_size != expected) {
      return absl::FailedPreconditionError(absl::StrCat(
          "swap file ", file.path, st.st_size < expected ? " was truncated to " : " grew to ",
          st.st_size, " bytes, expected ", expected, lost));
    }
  }
  if (!verify_) return absl::OkStatus();
  // The header page read back (an aligned buffer: the files may be
  // O_DIRECT). Its bytes are the data's neighbours: a program that wrote
  // into the file there has likely written elsewhere too.
  ZS_ASSIGN_OR_RETURN(AlignedBuffer page, AlignedBuffer::Allocate(kSwapAlignment));
  for (const File& file : files_) {
    char* bytes = static_cast<char*>(page.data());
    int64_t got = 0;
    while (got < kSwapAlignment) {
      const ssize_t n = pread(file.fd, bytes + got, static_cast<size_t>(kSwapAlignment - got), got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::InternalError(
            SystemError("cannot read the header page of swap file", file.path, errno) + lost);
      }
      if (n == 0) break;
      got += n;
    }
    const uint32_t crc = kernels::Crc32c(bytes, static_cast<size_t>(got));
    if (got != kSwapAlignment || crc != file.header_crc) {
      return absl::DataLossError(absl::StrFormat(
          "swap file %s (tensor %s): checksum mismatch in its header page (offset 0, %d bytes): "
          "crc32c 0x%08x read (%d bytes), 0x%08x written%s",
          file.path, file.name, kSwapAlignment, crc, got, file.header_crc, kDamagedRemedy));
    }
  }
  return absl::OkStatus();
}

IoBackend SwapFiles::backend() const { return io_->backend(); }

std::string SwapFiles::describe() const {
  return absl::StrCat(io_->describe(), ", ", storage_note_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("aligned buffer of ", bytes, " bytes"));
  }
  AlignedBuffer buffer;
  buffer.size_ = RoundUpToSwapAlignment(bytes);
  if (buffer.size_ == 0) return buffer;
  void* data = nullptr;
  if (posix_memalign(&data, static_cast<size_t>(kSwapAlignment),
                     static_cast<size_t>(buffer.size_)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", buffer.size_, " bytes of host memory aligned to ", kSwapAlignment));
  }
  buffer.data_ = data;
  return buffer;
}

absl::StatusOr<double> MeasureSequentialSeconds(SwapFiles& files, int tensor, void* buf,
                                                int64_t chunk_bytes, bool write, int in_flight) {
  if (chunk_bytes <= 0 || chunk_bytes % kSwapAlignment != 0 || in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MeasureSequentialSeconds: chunk_bytes ", chunk_bytes, " (a positive multiple of ",
        kSwapAlignment, ") and in_flight ", in_flight, " (>= 1)"));
  }
  const int64_t total = files.rounded_bytes(tensor);
  std::vector<SwapFiles::Ticket> slots(static_cast<size_t>(in_flight), 0);
  const auto start = std::chrono::steady_clock::now();
  int64_t chunk = 0;
  for (int64_t at = 0; at < total; at += chunk_bytes, ++chunk) {
    const size_t slot = static_cast<size_t>(chunk % in_flight);
    if (slots[slot] != 0) {
      absl::Status waited = files.Wait(slots[slot]);
      if (!waited.ok()) {
        files.WaitAll().IgnoreError();  // `buf` must outlive every transfer
        return waited;
      }
    }
    char* host = static_cast<char*>(buf) + static_cast<int64_t>(slot) * chunk_bytes;
    const int64_t bytes = std::min(chunk_bytes, total - at);
    absl::StatusOr<SwapFiles::Ticket> ticket = write ? files.WriteAsync(tensor, at, host, bytes)
                                                     : files.ReadAsync(tensor, at, host, bytes);
    if (!ticket.ok()) {
      files.WaitAll().IgnoreError();
      return ticket.status();
    }
    slots[slot] = *ticket;
  }
  absl::Status first;
  for (SwapFiles::Ticket ticket : slots) {
    if (ticket == 0) continue;
    absl::Status waited = files.Wait(ticket);
    if (first.ok()) first = waited;
  }
  ZS_RETURN_IF_ERROR(first);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace zeroshard::internal
