// InspectCheckpoint and ExportSafetensors: reading a checkpoint without an
// engine (the `zeroshard inspect` and `zeroshard export` commands).
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/checkpoint/directory.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/safetensors.h"
#include "engine/src/checkpoint/segment_reader.h"
#include "engine/src/common/checked_math.h"
#include "engine/src/layout/flat_layout.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

// Refuses an export target that would change the checkpoint it reads: the
// same file as anything the checkpoint directory holds (compared by device
// and inode, so a symlink, a hard link or another spelling of the path is
// caught), a file inside it, or a directory.
absl::Status CheckExportTarget(const std::string& path, const std::string& step_dir,
                               const std::string& out) {
  using internal::FileIdentity;
  using internal::IdentityOf;
  using internal::JoinPath;
  if (internal::IsDirectory(out)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--out %s is a directory; give the path of the file to write", out));
  }
  // The checkpoint directory: what the user named, the step it resolved to,
  // and the directory holding that step when it is a checkpoint directory.
  std::vector<std::string> dirs = {path, step_dir};
  const std::string parent = internal::ParentPath(step_dir);
  if (internal::PathExists(JoinPath(parent, internal::kLatestName)) ||
      internal::ParseStepDirName(step_dir.substr(step_dir.find_last_of('/') + 1)) >= 0) {
    dirs.push_back(parent);
  }
  std::vector<std::pair<FileIdentity, std::string>> held;  // identity, path
  std::vector<FileIdentity> held_dirs;
  auto hold = [&](const std::string& p) {
    if (std::optional<FileIdentity> id = IdentityOf(p)) held.push_back({*id, p});
  };
  for (const std::string& dir : dirs) {
    if (std::optional<FileIdentity> id = IdentityOf(dir)) held_dirs.push_back(*id);
    absl::StatusOr<std::vector<std::string>> names = internal::ListDirectory(dir);
    if (!names.ok()) continue;
    for (const std::string& name : *names) {
      const std::string entry = JoinPath(dir, name);
      hold(entry);
      if (!absl::StartsWith(name, "step_") || !internal::IsDirectory(entry)) continue;
      if (std::optional<FileIdentity> id = IdentityOf(entry)) held_dirs.push_back(*id);
      absl::StatusOr<std::vector<std::string>> files = internal::ListDirectory(entry);
      if (!files.ok()) continue;
      for (const std::string& file : *files) hold(JoinPath(entry, file));
    }
  }
  if (std::optional<FileIdentity> target = IdentityOf(out)) {
    for (const auto& [id, p] : held) {
      if (id == *target) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--out %s is the checkpoint's own %s; writing it would destroy the "
                            "checkpoint: give a path outside the checkpoint directory",
                            out, p));
      }
    }
  }
  if (std::optional<FileIdentity> out_dir = IdentityOf(internal::ParentPath(out))) {
    for (const FileIdentity& id : held_dirs) {
      if (id == *out_dir) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--out %s is inside the checkpoint directory, whose steps are replaced and "
            "pruned by later saves: give a path outside it",
            out));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointInfo> InspectCheckpoint(const std::string& path,
                                                 std::vector<std::string>* problems,
                                                 const CheckpointProgress& progress) {
  std::string note;
  ZS_ASSIGN_OR_RETURN(std::string step_dir, internal::ResolveCheckpointWithNote(path, &note));
  ZS_ASSIGN_OR_RETURN(internal::Manifest manifest, internal::ReadManifest(step_dir));
  int64_t total = 0, done = 0;
  for (const internal::FileRecord& f : manifest.files) total += f.bytes;
  for (int r = 0; r < manifest.world_size; ++r) {
    internal::VerifyRankFile(step_dir, manifest, r, problems);
    done += manifest.files[r].bytes;
    if (progress) progress(done, total);
  }
  return internal::DescribeCheckpoint(step_dir, manifest, note);
}

absl::StatusOr<CheckpointInfo> ReadCheckpointInfo(const std::string& path) {
  std::string note;
  ZS_ASSIGN_OR_RETURN(std::string step_dir, internal::ResolveCheckpointWithNote(path, &note));
  ZS_ASSIGN_OR_RETURN(internal::Manifest manifest, internal::ReadManifest(step_dir));
  return internal::DescribeCheckpoint(step_dir, manifest, note);
}

absl::Status ExportSafetensors(const std::string& path, const std::string& out, DType dtype,
                               ExportStats* stats, const CheckpointProgress& progress) {
  ExportOptions options;
  options.dtype = dtype;
  return ExportSafetensors(path, out, options, stats, progress);
}

absl::Status ExportSafetensors(const std::string& path, const std::string& out,
                               const ExportOptions& options, ExportStats* stats,
                               const CheckpointProgress& progress) {
  const DType dtype = options.dtype;
  auto name_of = [&options](const std::string& unit,
                            const std::string& param) -> absl::StatusOr<std::string> {
    if (!options.tensor_name) return absl::StrCat(unit, ".", param);
    return options.tensor_name(unit, param);
  };
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("export: dtype %s is not supported; use fp32 or bf16", DTypeName(dtype)));
  }
  ZS_ASSIGN_OR_RETURN(std::string step_dir, ResolveCheckpoint(path));
  ZS_RETURN_IF_ERROR(CheckExportTarget(path, step_dir, out));
  ZS_ASSIGN_OR_RETURN(internal::Manifest m, internal::ReadManifest(step_dir));
  ZS_ASSIGN_OR_RETURN(internal::FlatLayout layout,
                      internal::FlatLayout::Create(m.model, m.world_size));
  ExportStats local;
  ExportStats& s = stats != nullptr ? *stats : local;
  s = ExportStats{};

  // The header first (every shape is known), then the data segment by
  // segment, in the same order. A tied param is written once, under its
  // owner's name; the metadata records each alias ("head.weight" ->
  // "embed.weight" in "zeroshard_tied").
  std::vector<internal::SafetensorsTensor> tensors;
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const internal::ParamSlot& slot : layout.unit(u).params) {
      const UnitSpec& unit = m.model.units[slot.spec_unit];
      const ParamSpec& p = unit.params[slot.spec_param];
      ZS_ASSIGN_OR_RETURN(std::string name, name_of(unit.name, p.name));
      tensors.push_back({std::move(name), dtype == DType::kFloat32 ? "F32" : "BF16", p.shape});
    }
  }
  std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                 {"zeroshard_step", absl::StrCat(m.step)},
                                                 {"zeroshard_checkpoint", step_dir}};
  std::vector<std::string> ties;
  int64_t tied_numel = 0;
  for (const UnitSpec& unit : m.model.units) {
    for (const ParamSpec& p : unit.params) {
      if (!p.tied_to.has_value()) continue;
      ZS_ASSIGN_OR_RETURN(std::string alias, name_of(unit.name, p.name));
      ZS_ASSIGN_OR_RETURN(std::string owner, name_of(p.tied_to->unit, p.tied_to->param));
      ties.push_back(absl::StrCat(alias, "=", owner));
      tied_numel += p.NumElements();
    }
  }
  if (!ties.empty()) metadata["zeroshard_tied"] = absl::StrJoin(ties, ",");
  ZS_ASSIGN_OR_RETURN(std::string header, internal::SafetensorsHeader(tensors, metadata));

  // Written under a temporary name, removed on every error (AtomicFile).
  ZS_ASSIGN_OR_RETURN(internal::AtomicFile file, internal::AtomicFile::Create(out));
  ZS_RETURN_IF_ERROR(file.Write(header.data(), header.size()));
  s.bytes_written = static_cast<int64_t>(header.size());
  const int64_t header_bytes = s.bytes_written;
  const int64_t tensor_bytes =
      (m.model.NumParams() - tied_numel) * (dtype == DType::kFloat32 ? 4 : 2);

  internal::SegmentReader reader(step_dir, m);
  std::vector<float> segment;
  std::vector<uint16_t> halves;
  for (int u = 0; u < layout.num_units(); ++u) {
    // One unit's fp32 master weights, from every old rank's shard.
    const int64_t used = layout.unit(u).used_numel;
    segment.assign(static_cast<size_t>(used), 0.0f);
    s.peak_buffer_bytes =
        std::max<int64_t>(s.peak_buffer_bytes, used * static_cast<int64_t>(sizeof(float)));
    float* const master_only[internal::kTensorsPerUnit] = {segment.data(), nullptr, nullptr};
    ZS_RETURN_IF_ERROR(reader.Read(u, 0, used, master_only));
    for (const internal::ParamSlot& slot : layout.unit(u).params) {
      const float* values = segment.data() + slot.offset;
      const size_t n = static_cast<size_t>(slot.numel);
      if (dtype == DType::kFloat32) {
        ZS_RETURN_IF_ERROR(file.Write(values, n * sizeof(float)));
        s.bytes_written += static_cast<int64_t>(n * sizeof(float));
      } else {
        halves.resize(n);
        for (size_t i = 0; i < n; ++i) halves[i] = Fp32ToBf16(values[i]);
        ZS_RETURN_IF_ERROR(file.Write(halves.data(), n * sizeof(uint16_t)));
        s.bytes_written += static_cast<int64_t>(n * sizeof(uint16_t));
      }
      ++s.tensors;
    }
    if (progress) progress(s.bytes_written - header_bytes, tensor_bytes);
  }
  return file.Commit();
}

}  // namespace zeroshard
