// InspectCheckpoint and ExportSafetensors: reading a checkpoint without an
// engine (the `zeroshard inspect` and `zeroshard export` commands).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/safetensors.h"
#include "engine/src/common/checked_math.h"
#include "engine/src/layout/flat_layout.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

CheckpointInfo Describe(const std::string& step_dir, const internal::Manifest& m) {
  CheckpointInfo info;
  info.path = step_dir;
  info.step = m.step;
  info.world_size = m.world_size;
  info.zero_stage = m.train.zero_stage;
  info.precision = m.train.precision;
  info.grad_accum_steps = m.train.grad_accum_steps;
  info.num_params = m.model.NumParams();
  info.num_units = static_cast<int>(m.model.units.size());
  for (const internal::FileRecord& f : m.files) info.file_bytes.push_back(f.bytes);
  info.trainer_state = m.trainer_state;
  return info;
}

}  // namespace

absl::StatusOr<CheckpointInfo> InspectCheckpoint(const std::string& path,
                                                 std::vector<std::string>* problems,
                                                 const CheckpointProgress& progress) {
  ZS_ASSIGN_OR_RETURN(std::string step_dir, ResolveCheckpoint(path));
  ZS_ASSIGN_OR_RETURN(internal::Manifest manifest, internal::ReadManifest(step_dir));
  int64_t total = 0, done = 0;
  for (const internal::FileRecord& f : manifest.files) total += f.bytes;
  for (int r = 0; r < manifest.world_size; ++r) {
    internal::VerifyRankFile(step_dir, manifest, r, problems);
    done += manifest.files[r].bytes;
    if (progress) progress(done, total);
  }
  return Describe(step_dir, manifest);
}

absl::Status ExportSafetensors(const std::string& path, const std::string& out, DType dtype,
                               ExportStats* stats, const CheckpointProgress& progress) {
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("export: dtype %s is not supported; use fp32 or bf16", DTypeName(dtype)));
  }
  ZS_ASSIGN_OR_RETURN(std::string step_dir, ResolveCheckpoint(path));
  ZS_ASSIGN_OR_RETURN(internal::Manifest m, internal::ReadManifest(step_dir));
  ZS_ASSIGN_OR_RETURN(internal::FlatLayout layout,
                      internal::FlatLayout::Create(m.model, m.world_size));
  ExportStats local;
  ExportStats& s = stats != nullptr ? *stats : local;
  s = ExportStats{};

  // The header first (every shape is known), then the data unit by unit.
  std::vector<internal::SafetensorsTensor> tensors;
  for (const UnitSpec& unit : m.model.units) {
    for (const ParamSpec& p : unit.params) {
      tensors.push_back({absl::StrCat(unit.name, ".", p.name),
                         dtype == DType::kFloat32 ? "F32" : "BF16", p.shape});
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"zeroshard_step", absl::StrCat(m.step)},
                                                       {"zeroshard_checkpoint", step_dir}};
  ZS_ASSIGN_OR_RETURN(std::string header, internal::SafetensorsHeader(tensors, metadata));

  const std::string tmp = out + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrFormat("export: create %s: %s (errno %d)", tmp, std::strerror(errno), errno));
  }
  auto fail = [&](absl::Status status) {
    close(fd);
    unlink(tmp.c_str());
    return status;
  };
  absl::Status written = internal::WriteAll(fd, header.data(), header.size(), tmp);
  if (!written.ok()) return fail(written);
  s.bytes_written = static_cast<int64_t>(header.size());
  const int64_t header_bytes = s.bytes_written;
  const int64_t tensor_bytes = m.model.NumParams() * (dtype == DType::kFloat32 ? 4 : 2);

  std::vector<std::unique_ptr<internal::RankFileReader>> readers(m.world_size);
  std::vector<float> segment;
  std::vector<uint16_t> halves;
  for (int u = 0; u < layout.num_units(); ++u) {
    // One unit's fp32 master weights, from every old rank's shard.
    const int64_t used = layout.unit(u).used_numel;
    segment.assign(static_cast<size_t>(used), 0.0f);
    s.peak_buffer_bytes =
        std::max<int64_t>(s.peak_buffer_bytes, used * static_cast<int64_t>(sizeof(float)));
    for (int r = 0; r < m.world_size; ++r) {
      const int64_t shard = m.shard_numel[u];
      const int64_t begin = r * shard;
      const int64_t end = std::min((r + 1) * shard, used);
      if (begin >= end) continue;
      if (readers[r] == nullptr) {
        absl::StatusOr<internal::RankFileReader> reader =
            internal::RankFileReader::Open(step_dir, m, r);
        if (!reader.ok()) return fail(reader.status());
        readers[r] = std::make_unique<internal::RankFileReader>(std::move(*reader));
      }
      absl::Status read = readers[r]->Read(u, /*tensor=*/0, 0, end - begin, segment.data() + begin);
      if (!read.ok()) return fail(read);
    }
    for (const internal::ParamSlot& slot : layout.unit(u).params) {
      const float* values = segment.data() + slot.offset;
      const size_t n = static_cast<size_t>(slot.numel);
      if (dtype == DType::kFloat32) {
        written = internal::WriteAll(fd, values, n * sizeof(float), tmp);
        s.bytes_written += static_cast<int64_t>(n * sizeof(float));
      } else {
        halves.resize(n);
        for (size_t i = 0; i < n; ++i) halves[i] = Fp32ToBf16(values[i]);
        written = internal::WriteAll(fd, halves.data(), n * sizeof(uint16_t), tmp);
        s.bytes_written += static_cast<int64_t>(n * sizeof(uint16_t));
      }
      if (!written.ok()) return fail(written);
      ++s.tensors;
    }
    if (progress) progress(s.bytes_written - header_bytes, tensor_bytes);
  }
  if (fsync(fd) != 0) {
    return fail(
        absl::InternalError(absl::StrFormat("export: fsync %s: %s", tmp, std::strerror(errno))));
  }
  if (close(fd) != 0) {
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrFormat("export: close %s: %s", tmp, std::strerror(errno)));
  }
  return internal::RenamePath(tmp, out);
}

}  // namespace zeroshard
