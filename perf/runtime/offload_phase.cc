#include "perf/runtime/offload_phase.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/crc32c.h"
#include "perf/kernels/streams_baseline.h"
#include "perf/runtime/mlp_bench_train_spec.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/model_spec.h"
#include "zeroshard/offload.h"
#include "zeroshard/status.h"

namespace zeroshard::perf {

Spread SpreadOf(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

namespace {

namespace fs = std::filesystem;

double SecondsOf(const std::function<absl::Status()>& fn, absl::Status* status) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = fn();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (status->ok()) *status = s;
  return seconds;
}

// One tier's offloaded optimizer over the synthetic model (the engine's
// own, through zeroshard/offload.h).
struct Rig {
  Precision precision;
  MemoryTier tier;
  TrainSpec train;
  std::unique_ptr<OffloadPhase> phase;
  int64_t state_numel = 0;

  const BufferPlan& plan() const { return phase->plan(); }
  DType grad_dtype() const { return train.effective_grad_dtype(); }
  bool mixed() const { return precision != Precision::kFp32; }
};

ModelSpec SyntheticModel(const PhaseOptions& opts) {
  ModelSpec model;
  const int64_t per_unit = (opts.params + opts.units - 1) / opts.units;
  int64_t left = opts.params;
  for (int u = 0; u < opts.units && left > 0; ++u) {
    const int64_t n = std::min(per_unit, left);
    left -= n;
    ParamSpec w;
    w.name = "w";
    w.shape = {n};
    UnitSpec unit;
    unit.name = absl::StrCat("unit", u);
    unit.params.push_back(w);
    model.units.push_back(unit);
  }
  return model;
}

absl::StatusOr<std::unique_ptr<Rig>> MakeRig(const PhaseOptions& opts, Precision precision,
                                             MemoryTier tier, const std::string& dir) {
  auto rig = std::make_unique<Rig>();
  rig->precision = precision;
  rig->tier = tier;
  rig->train = perf::MlpBenchTrainSpec(/*stage=*/1, precision, /*prefetch_units=*/1);
  rig->train.offload.optimizer = tier;
  rig->train.offload.dir = tier == MemoryTier::kNvme ? dir : "";
  rig->train.offload.chunk_numel = opts.chunk;
  ZS_ASSIGN_OR_RETURN(rig->phase, OffloadPhase::Create(SyntheticModel(opts), rig->train));
  rig->state_numel = rig->phase->state_numel();
  return rig;
}

// Bytes the AdamW update reads and writes per element (adam_bench's
// definitions): the master (or fp32 params) read + written 8, m and v 8
// each, the gradient read (its size), the 16-bit params written (mixed).
int64_t UpdateBytesPerElement(const Rig& rig) {
  return 24 + static_cast<int64_t>(DTypeSize(rig.grad_dtype())) + (rig.mixed() ? 2 : 0);
}

absl::Status Apply(Rig& rig, OffloadPhaseParts parts) { return rig.phase->Run(parts); }
constexpr OffloadPhaseParts kEverything{true, true, true};
constexpr OffloadPhaseParts kUpdateOnly{false, true, false};
constexpr OffloadPhaseParts kCopiesOnly{true, false, false};
constexpr OffloadPhaseParts kIoOnly{false, false, true};

// Page-aligned host memory backed by transparent huge pages where the
// kernel allows (as adam_bench's buffers, and as the host tier's 4 KiB
// aligned buffers get them), filled with `value`.
template <typename T>
struct HugeArray {
  HugeArray() = default;
  HugeArray(size_t n, T value) {
    constexpr size_t kAlign = size_t{2} << 20;
    const size_t bytes = std::max(kAlign, (n * sizeof(T) + kAlign - 1) / kAlign * kAlign);
    data.reset(static_cast<T*>(std::aligned_alloc(kAlign, bytes)));
    if (data == nullptr) {
      std::fprintf(stderr, "offload_bench: cannot allocate %zu bytes; lower --params\n", bytes);
      std::exit(1);
    }
    madvise(data.get(), bytes, MADV_HUGEPAGE);
    std::fill(data.get(), data.get() + n, value);
  }
  T* get() const { return data.get(); }
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data;
};

// The streams baseline over the host tier's chunks: per chunk, the gradient
// from one of two chunk slots, the params (fp32) or master (mixed) and the
// moments of that chunk's elements, the 16-bit params into a chunk slot:
// the host update's bytes in its pattern, on buffers of its own.
class StreamsBaseline {
 public:
  StreamsBaseline(int64_t numel, int64_t chunk, bool mixed, DType grad_dtype)
      : numel_(numel), chunk_(chunk), mixed_(mixed), grad16_(grad_dtype != DType::kFloat32) {
    const size_t slots = static_cast<size_t>(2 * chunk);
    const size_t n = static_cast<size_t>(numel);
    if (grad16_) {
      grad16_slots_ = HugeArray<uint16_t>(slots, 0x3a83);
    } else {
      grad32_slots_ = HugeArray<float>(slots, 1e-3f);
    }
    if (mixed) {
      out_slots_ = HugeArray<uint16_t>(slots, 0);
      master_ = HugeArray<float>(n, 0.05f);
    } else {
      param_slots_ = HugeArray<float>(slots, 0.05f);
    }
    m_ = HugeArray<float>(n, 1e-4f);
    v_ = HugeArray<float>(n, 1e-8f);
  }
  void Pass() {
    for (int64_t c = 0, at = 0; at < numel_; ++c, at += chunk_) {
      const size_t n = static_cast<size_t>(std::min(chunk_, numel_ - at));
      const size_t slot = static_cast<size_t>((c % 2) * chunk_);
      float* p = mixed_ ? master_.get() + at : param_slots_.get() + slot;
      uint16_t* out = mixed_ ? out_slots_.get() + slot : nullptr;
      if (grad16_) {
        perf::StreamsPassU16(grad16_slots_.get() + slot, p, m_.get() + at, v_.get() + at, out, 0,
                             n);
      } else {
        perf::StreamsPassF32(grad32_slots_.get() + slot, p, m_.get() + at, v_.get() + at, out, 0,
                             n);
      }
    }
  }

 private:
  int64_t numel_, chunk_;
  bool mixed_, grad16_;
  HugeArray<float> grad32_slots_, param_slots_, master_, m_, v_;
  HugeArray<uint16_t> grad16_slots_, out_slots_;
};

// The disk's own time for the NVMe tier's bytes: swap files of the same
// sizes (rank 1's names, beside the rig's; rank 2's for the files without
// checksums), read and written sequentially through the engine's own I/O
// path.
absl::StatusOr<std::unique_ptr<SwapFileProbe>> MakeDiskProbe(const Rig& rig, const std::string& dir,
                                                             int in_flight, bool verify) {
  std::vector<int64_t> sizes;
  for (const PlannedBuffer& b : rig.plan().buffers) {
    if (b.tier == MemoryTier::kNvme) sizes.push_back(b.bytes());
  }
  return SwapFileProbe::Create(dir, sizes,
                               rig.plan().offload_chunk_numel * static_cast<int64_t>(sizeof(float)),
                               in_flight, /*rank=*/verify ? 1 : 2, verify);
}

// One `dd` command: dd's own seconds (its last line), else the wall time.
absl::StatusOr<double> RunDd(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("popen: ", command));
  std::string output;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
  const int rc = pclose(pipe);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rc != 0) {
    return absl::InternalError(absl::StrFormat("`%s` failed (status %d): %s", command, rc, output));
  }
  // dd's own figure ("..., 1.234 s, ..."): the copy without the process start.
  const size_t s = output.rfind(" s,");
  if (s != std::string::npos) {
    const size_t comma = output.rfind(", ", s - 1);
    if (comma != std::string::npos) {
      const double dd_seconds = std::atof(output.substr(comma + 2, s - comma - 2).c_str());
      if (dd_seconds > 0) return dd_seconds;
    }
  }
  return seconds;
}

}  // namespace

DdResult MeasureDd(const std::string& dir, int64_t bytes, int64_t chunk_bytes) {
  DdResult r;
  if (system("command -v dd >/dev/null 2>&1") != 0) {
    r.note = "dd not found";
    return r;
  }
  const std::string file = dir + "/zs_offload_bench_dd.bin";
  const int64_t count = (bytes + chunk_bytes - 1) / chunk_bytes;
  absl::StatusOr<double> w = RunDd(absl::StrFormat(
      "dd if=/dev/zero of='%s' bs=%d count=%d oflag=direct conv=fsync", file, chunk_bytes, count));
  absl::StatusOr<double> rd =
      w.ok()
          ? RunDd(absl::StrFormat("dd if='%s' of=/dev/null bs=%d iflag=direct", file, chunk_bytes))
          : w;
  std::error_code ec;
  fs::remove(file, ec);
  if (!w.ok() || !rd.ok()) {
    r.note = std::string((w.ok() ? rd : w).status().message());
    return r;
  }
  r.ran = true;
  r.write_s = *w;
  r.read_s = *rd;
  r.note = absl::StrFormat("dd bs=%d count=%d, oflag=direct conv=fsync / iflag=direct", chunk_bytes,
                           count);
  return r;
}
absl::StatusOr<PrecisionResult> MeasureOptimizerPhase(const PhaseOptions& opts, Precision precision,
                                                      const std::string& dir) {
  PrecisionResult result;
  result.precision = precision;
  std::unique_ptr<Rig> host, nvme;
  std::unique_ptr<StreamsBaseline> streams;
  std::unique_ptr<SwapFileProbe> probe, unverified;
  if (opts.host) {
    ZS_ASSIGN_OR_RETURN(host, MakeRig(opts, precision, MemoryTier::kHost, dir));
    streams = std::make_unique<StreamsBaseline>(host->state_numel, host->plan().offload_chunk_numel,
                                                host->mixed(), host->grad_dtype());
    result.state_numel = host->state_numel;
    result.chunk = host->plan().offload_chunk_numel;
  }
  if (opts.nvme) {
    ZS_ASSIGN_OR_RETURN(nvme, MakeRig(opts, precision, MemoryTier::kNvme, dir));
    ZS_ASSIGN_OR_RETURN(probe, MakeDiskProbe(*nvme, dir, opts.in_flight, /*verify=*/true));
    ZS_ASSIGN_OR_RETURN(unverified, MakeDiskProbe(*nvme, dir, opts.in_flight, /*verify=*/false));
    result.state_numel = nvme->state_numel;
    result.chunk = nvme->plan().offload_chunk_numel;
  }
  // One untimed pass of each: first touches, the file system's allocation.
  for (Rig* rig : {host.get(), nvme.get()}) {
    if (rig != nullptr) ZS_RETURN_IF_ERROR(Apply(*rig, kEverything));
  }
  if (streams) streams->Pass();
  for (SwapFileProbe* p : {probe.get(), unverified.get()}) {
    if (p == nullptr) continue;
    ZS_RETURN_IF_ERROR(p->Pass(/*write=*/true).status());
    ZS_RETURN_IF_ERROR(p->Pass(/*write=*/false).status());
  }
  std::vector<double> h_phase, h_adamw, h_copies, h_streams;
  std::vector<double> n_phase, n_adamw, n_io, n_read, n_write;
  std::vector<double> n_read_unverified, n_write_unverified;
  HostResult hr;
  NvmeResult nr;
  absl::Status status;
  for (int r = 0; r < opts.repeats && status.ok(); ++r) {
    std::fprintf(stderr, "offload_bench: %s, repeat %d/%d\n", PrecisionName(precision), r + 1,
                 opts.repeats);
    if (host) {
      h_phase.push_back(SecondsOf([&] { return Apply(*host, kEverything); }, &status));
      hr.copy_bytes = host->phase->last_bytes().to_host + host->phase->last_bytes().to_device;
      hr.update_bytes = host->state_numel * UpdateBytesPerElement(*host);
      h_adamw.push_back(SecondsOf([&] { return Apply(*host, kUpdateOnly); }, &status));
      h_copies.push_back(SecondsOf([&] { return Apply(*host, kCopiesOnly); }, &status));
      h_streams.push_back(SecondsOf(
          [&] {
            streams->Pass();
            return absl::OkStatus();
          },
          &status));
    }
    if (nvme) {
      n_phase.push_back(SecondsOf([&] { return Apply(*nvme, kEverything); }, &status));
      nr.io_bytes = nvme->phase->last_bytes().read + nvme->phase->last_bytes().written;
      n_adamw.push_back(SecondsOf([&] { return Apply(*nvme, kUpdateOnly); }, &status));
      n_io.push_back(SecondsOf([&] { return Apply(*nvme, kIoOnly); }, &status));
      // The passes with and without the checksums back to back, the order
      // alternating per repeat, so that neither always runs first.
      double seconds[2][2] = {};  // [verified][write]
      for (int k = 0; k < 4 && status.ok(); ++k) {
        const bool verified = ((k / 2) ^ (r % 2)) == 0;
        const bool write = k % 2 == 1;
        absl::StatusOr<double> s = (verified ? probe : unverified)->Pass(write);
        if (!s.ok()) {
          status.Update(s.status());
          break;
        }
        seconds[verified][write] = *s;
      }
      if (status.ok()) {
        n_read.push_back(seconds[1][0]);
        n_write.push_back(seconds[1][1]);
        n_read_unverified.push_back(seconds[0][0]);
        n_write_unverified.push_back(seconds[0][1]);
      }
    }
  }
  ZS_RETURN_IF_ERROR(status);
  if (host) {
    hr.phase = SpreadOf(h_phase);
    hr.adamw = SpreadOf(h_adamw);
    hr.copies = SpreadOf(h_copies);
    hr.streams = SpreadOf(h_streams);
    // Paired: each repeat's parts ran back to back, under the same load;
    // the ratios are taken per repeat, then their median.
    std::vector<double> ratio, hidden;
    for (size_t r = 0; r < h_phase.size(); ++r) {
      ratio.push_back(h_phase[r] / std::max(h_adamw[r], h_copies[r]));
      hidden.push_back(std::clamp(1.0 - (h_phase[r] - h_adamw[r]) / h_copies[r], 0.0, 1.0));
    }
    hr.ratio = SpreadOf(ratio);
    hr.hidden = SpreadOf(hidden);
    hr.adamw_vs_streams = hr.streams.median / hr.adamw.median;
    hr.describe = host->phase->Describe();
    result.host = hr;
  }
  if (nvme) {
    nr.phase = SpreadOf(n_phase);
    nr.adamw = SpreadOf(n_adamw);
    nr.io = SpreadOf(n_io);
    nr.disk_read = SpreadOf(n_read);
    nr.disk_write = SpreadOf(n_write);
    nr.disk_read_unverified = SpreadOf(n_read_unverified);
    nr.disk_write_unverified = SpreadOf(n_write_unverified);
    std::vector<double> read_pct, write_pct;
    for (size_t r = 0; r < n_read.size(); ++r) {
      read_pct.push_back(100.0 * (n_read[r] / n_read_unverified[r] - 1.0));
      write_pct.push_back(100.0 * (n_write[r] / n_write_unverified[r] - 1.0));
    }
    nr.crc_read_overhead_pct = SpreadOf(read_pct);
    nr.crc_write_overhead_pct = SpreadOf(write_pct);
    nr.crc_implementation = kernels::Crc32cImplementation();
    std::vector<double> disk, ratio;
    for (size_t r = 0; r < n_phase.size(); ++r) {
      disk.push_back(n_read[r] + n_write[r]);
      ratio.push_back(n_phase[r] / std::max(n_adamw[r], disk.back()));
    }
    nr.disk = SpreadOf(disk);
    nr.ratio = SpreadOf(ratio);
    nr.pass = nr.ratio.median <= opts.limit;
    nr.describe = nvme->phase->Describe();
    nr.io_backend = probe->Describe();
    result.nvme = nr;
  }
  return result;
}

}  // namespace zeroshard::perf
