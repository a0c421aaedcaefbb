#include "engine/src/runtime/checkpoint_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/src/checkpoint/directory.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/runtime/status_words.h"
#include "zeroshard/input_file.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

// A status's message without a leading "<call>: " (a rank's own check
// already named the call), so that the shared message names it once.
std::string WithoutPrefix(const absl::Status& status, const char* call) {
  absl::string_view message = status.message();
  absl::ConsumePrefix(&message, absl::StrCat(call, ": "));
  return std::string(message);
}

// A number no other save or check of any run picks, for the directory check.
uint64_t FreshNonce() {
  std::random_device device;
  const uint64_t clock =
      static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return ((static_cast<uint64_t>(device()) << 32) ^ device() ^ (clock * 0x9e3779b97f4a7c15ull)) | 1;
}

}  // namespace

CheckpointWriter::CheckpointWriter(const FlatLayout& layout, int rank, bool mixed,
                                   DType param_dtype, const ShardBuffers& buffers,
                                   RuntimeServices& services)
    : layout_(layout),
      rank_(rank),
      world_(services.comm().size()),
      mixed_(mixed),
      param_dtype_(param_dtype),
      buffers_(buffers),
      services_(services) {}

CheckpointWriter::~CheckpointWriter() {
  if (pending_ != nullptr && pending_->writer.joinable()) pending_->writer.join();
}

namespace {

// `path` as a message shows it: a relative path with the absolute one this
// process resolves it to, since ranks in different working directories give
// the same relative path different meanings ("ck (/home/a/ck)").
std::string ShownPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return absl::StrFormat("%s (%s)", path, JoinPath(cwd, path));
}

}  // namespace

absl::Status CheckpointWriter::CheckSharedDirectory(const std::string& root,
                                                    const std::string& check_dir, bool fresh,
                                                    const absl::Status& local, const char* call) {
  // 1. Rank 0 makes the directory and leaves a probe holding a fresh number.
  const uint64_t nonce = FreshNonce();
  const std::string probe = JoinPath(check_dir, kDirectoryProbeName);
  std::vector<int64_t> prepared(1 + kStatusWords, 0);
  if (rank_ == 0) {
    // Nothing is made for a call this rank already found wrong.
    absl::Status made = local.ok() ? MakeDirectories(root) : local;
    if (made.ok() && fresh) made = RemoveTree(check_dir);  // a crashed save's files
    if (made.ok()) made = MakeDirectories(check_dir);
    // No fsync: the probe only has to be visible to the other ranks.
    if (made.ok()) made = WriteFilePlainly(probe, absl::StrFormat("%016x\n", nonce));
    if (!local.ok()) {
      made = absl::Status(local.code(), absl::StrCat("rank 0: ", WithoutPrefix(local, call)));
    } else if (!made.ok()) {
      made = absl::Status(made.code(), absl::StrCat("rank 0 could not prepare the checkpoint "
                                                    "directory: ",
                                                    made.message()));
    }
    prepared[0] = static_cast<int64_t>(nonce);
    PackStatus(made, &prepared[1]);
    // On success the message words carry rank 0's path, for every rank's
    // report.
    if (made.ok()) PackMessage(ShownPath(check_dir), &prepared[3]);
  }
  services_.log().Note(CollectiveKind::kCheckpoint, -4, 1 + kStatusWords);
  ZS_RETURN_IF_ERROR(services_.HostBroadcast(prepared.data(), 1 + kStatusWords, 0));
  if (prepared[1] != 1) {
    return UnpackStatus(&prepared[1], absl::StrCat(call, ": "));
  }
  const std::string expected = absl::StrFormat("%016x\n", static_cast<uint64_t>(prepared[0]));
  const std::string rank0_dir = UnpackMessage(&prepared[3]);

  // 2. Every rank finds that probe through its own path, and can write there.
  absl::Status mine = local;
  bool sees_another = false;  // travels with the status: every rank classifies alike
  if (mine.ok()) {
    absl::StatusOr<std::string> seen = ReadInputFile(probe, "the directory check's probe", 64);
    if (!seen.ok() || *seen != expected) {
      sees_another = true;
      mine = absl::FailedPreconditionError(absl::StrFormat(
          "rank %d saves into %s, where %s", rank_, ShownPath(check_dir),
          !seen.ok() ? std::string("rank 0's probe file is not") : "another run's probe is"));
    }
  }
  if (mine.ok()) {
    // A file of this rank's own, created and (not committed) removed again.
    absl::StatusOr<AtomicFile> file =
        AtomicFile::Create(absl::StrFormat("%s.rank_%d", probe, rank_));
    if (!file.ok()) {
      mine = absl::Status(file.status().code(),
                          absl::StrFormat("rank %d cannot write into %s: %s", rank_, check_dir,
                                          file.status().message()));
    }
  }
  constexpr int kWords = kStatusWords + 1;
  std::vector<int64_t> mine_words(kWords, 0);
  PackStatus(mine, mine_words.data());
  mine_words[kStatusWords] = sees_another ? 1 : 0;
  std::vector<int64_t> all(static_cast<size_t>(kWords) * world_);
  services_.log().Note(CollectiveKind::kCheckpoint, -5, kWords);
  ZS_RETURN_IF_ERROR(services_.HostAllGather(mine_words.data(), all.data(), kWords));
  if (rank_ == 0 && !fresh) RemoveTree(probe).IgnoreError();

  // 3. Every rank reports the same verdict.
  std::vector<int> elsewhere;
  std::vector<std::string> where;
  absl::Status first = absl::OkStatus();
  for (int r = 0; r < world_; ++r) {
    const int64_t* rec = &all[static_cast<size_t>(r) * kWords];
    if (rec[0] == 1) continue;
    const absl::Status status = UnpackStatus(rec, "");
    if (rec[kStatusWords] == 1) {
      elsewhere.push_back(r);
      if (where.size() < 3) where.push_back(std::string(status.message()));
    } else if (first.ok()) {
      first = absl::Status(
          status.code(), absl::StrFormat("%s: rank %d: %s", call, r, WithoutPrefix(status, call)));
    }
  }
  if (!elsewhere.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: rank%s %s %s not see the checkpoint directory rank 0 prepared at %s (%s%s): every "
        "rank must save into the same directory, which for ranks on several machines means one "
        "on a shared file system",
        call, elsewhere.size() > 1 ? "s" : "", absl::StrJoin(elsewhere, ", "),
        elsewhere.size() > 1 ? "do" : "does", rank0_dir, absl::StrJoin(where, "; "),
        elsewhere.size() > where.size() ? "; ..." : ""));
  }
  return first;
}

absl::Status CheckpointWriter::Begin(const std::string& root, const CheckpointOptions& options,
                                     Manifest manifest, absl::Status local, int64_t state_bytes) {
  auto pending = std::make_unique<Pending>();
  pending->root = root;
  pending->options = options;
  pending->final_dir = JoinPath(root, StepDirName(manifest.step));
  pending->partial_dir = pending->final_dir + ".partial";
  pending->manifest = std::move(manifest);
  const Manifest& m = pending->manifest;
  if (local.ok()) {
    // The largest manifest this save can produce (every file record at its
    // widest) must be one a reader accepts. Only the trainer state changes
    // from save to save, so the rest is measured once.
    if (widest_manifest_bytes_ < 0) {
      Manifest widest = m;
      widest.trainer_state = "{}";
      FileRecord wide;
      wide.name = RankFileName(world_ - 1);
      wide.bytes = FileBytes(m.shard_numel, kChunkElements);
      wide.crc32c = wide.index_crc32c = UINT32_MAX;
      wide.unit_crc32c.assign(m.shard_numel.size(), UINT32_MAX);
      widest.files.assign(static_cast<size_t>(world_), wide);
      widest_manifest_bytes_ = static_cast<int64_t>(ManifestToJson(widest).size());
    }
    const int64_t bytes = widest_manifest_bytes_ + state_bytes;
    if (bytes > kMaxManifestBytes) {
      local = absl::InvalidArgumentError(absl::StrFormat(
          "Save: the manifest would be %d bytes, more than the %d a reader accepts (%d ranks x "
          "%d units); group small layers into fewer units",
          bytes, kMaxManifestBytes, world_, layout_.num_units()));
    }
  }
  // Every rank sees the directory rank 0 prepared and can write there, or
  // every rank fails here, before anything is written.
  ZS_RETURN_IF_ERROR(
      CheckSharedDirectory(root, pending->partial_dir, /*fresh=*/true, local, "Save"));
  ZS_RETURN_IF_ERROR(snapshot_source_ ? snapshot_source_(&snapshot_) : Snapshot(&snapshot_));
  Pending* p = pending.get();
  const std::string file = JoinPath(p->partial_dir, RankFileName(rank_));
  const int rank = rank_;
  const int world = world_;
  // The writer thread reads the snapshot; it and the rest of `pending` stay
  // unchanged until Commit joins it.
  const std::vector<float>* data = &snapshot_;
  p->writer = std::thread([p, file, rank, world, data] {
    absl::StatusOr<FileRecord> rec =
        WriteRankFile(file, rank, world, p->manifest.shard_numel, *data);
    if (rec.ok()) {
      p->record = *rec;
    } else {
      p->write_status = rec.status();
    }
  });
  pending_ = std::move(pending);
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Snapshot(std::vector<float>* snapshot) {
  // This rank's shard of each segment, master then m then v, in the file's
  // order. With fp32 the params are the master weights. A frozen segment
  // has params only: its values (exact in fp32) and zero moments.
  snapshot->resize(static_cast<size_t>(layout_.shard_numel()) * kTensorsPerUnit);
  float* out = snapshot->data();
  std::vector<std::pair<float*, std::vector<uint16_t>>> halves;  // converted after the sync
  for (int u = 0; u < layout_.num_units(); ++u) {
    const ElementRange shard = layout_.ShardRange(u, rank_);
    const size_t n = static_cast<size_t>(shard.size());
    if (!layout_.unit(u).trainable) {
      // Stage 3 holds the shard; stages 0-2 the whole segment, of which the
      // shard is a part.
      const void* params = buffers_.ParamsAt(u, shard.begin);
      if (param_dtype_ == DType::kFloat32) {
        ZS_RETURN_IF_ERROR(
            services_.CopyOnCompute(out, params, static_cast<int64_t>(n * sizeof(float))));
      } else {
        halves.emplace_back(out, std::vector<uint16_t>(n));
        ZS_RETURN_IF_ERROR(services_.CopyOnCompute(halves.back().second.data(), params,
                                                   static_cast<int64_t>(n * sizeof(uint16_t))));
      }
      std::fill(out + n, out + 3 * n, 0.0f);
      out += 3 * n;
      continue;
    }
    const float* master = mixed_ ? buffers_.MasterAt(u, shard.begin)
                                 : static_cast<const float*>(buffers_.ParamsAt(u, shard.begin));
    if (offload_ != nullptr) {
      // The state's tier is read now (host memory or the swap files); the
      // fp32 params, the master of fp32 runs, stay on the device.
      const int64_t index = buffers_.OptimizerIndex(u, shard.begin);
      const int64_t count = static_cast<int64_t>(n);
      if (mixed_) {
        ZS_RETURN_IF_ERROR(offload_->Read(StateTensor::kMaster, index, count, out));
      } else if (buffers_.ParamsOnNvme(u)) {
        ZS_RETURN_IF_ERROR(offload_->Read(StateTensor::kParams, index, count, out));
      } else {
        ZS_RETURN_IF_ERROR(
            services_.CopyOnCompute(out, master, static_cast<int64_t>(n * sizeof(float))));
      }
      ZS_RETURN_IF_ERROR(offload_->Read(StateTensor::kAdamM, index, count, out + n));
      ZS_RETURN_IF_ERROR(offload_->Read(StateTensor::kAdamV, index, count, out + 2 * n));
      out += 3 * n;
      continue;
    }
    const float* const tensors[kTensorsPerUnit] = {master, buffers_.AdamMAt(u, shard.begin),
                                                   buffers_.AdamVAt(u, shard.begin)};
    for (const float* tensor : tensors) {
      ZS_RETURN_IF_ERROR(
          services_.CopyOnCompute(out, tensor, static_cast<int64_t>(n * sizeof(float))));
      out += n;
    }
  }
  ZS_RETURN_IF_ERROR(services_.SyncCompute());
  for (auto& [dst, src] : halves) {
    if (param_dtype_ == DType::kBFloat16) {
      ConvertBf16ToFp32(src.data(), dst, src.size());
    } else {
      ConvertFp16ToFp32(src.data(), dst, src.size());
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Commit(const absl::Status& engine_status) {
  if (pending_ == nullptr) return absl::OkStatus();
  std::unique_ptr<Pending> p = std::move(pending_);
  if (p->writer.joinable()) p->writer.join();
  if (!p->options.keep_snapshot) std::vector<float>().swap(snapshot_);
  ZS_RETURN_IF_ERROR(engine_status);

  // 1. Every rank's write: its status, then the file's size and checksums.
  const int units = layout_.num_units();
  const int64_t words = kStatusWords + 3 + units;
  std::vector<int64_t> mine(static_cast<size_t>(words), 0);
  PackStatus(p->write_status, mine.data());
  int64_t* record = &mine[kStatusWords];
  record[0] = p->record.bytes;
  record[1] = p->record.crc32c;
  record[2] = p->record.index_crc32c;
  for (int u = 0; u < units && p->write_status.ok(); ++u) record[3 + u] = p->record.unit_crc32c[u];
  std::vector<int64_t> all(static_cast<size_t>(words) * world_);
  services_.log().Note(CollectiveKind::kCheckpoint, -1, words);
  ZS_RETURN_IF_ERROR(services_.HostAllGather(mine.data(), all.data(), words));
  for (int r = 0; r < world_; ++r) {
    // The first failed rank's error, with its code, on every rank.
    ZS_RETURN_IF_ERROR(UnpackStatus(
        &all[static_cast<size_t>(r) * words],
        absl::StrFormat("checkpoint %s was not completed (`latest` is unchanged): rank %d: ",
                        p->final_dir, r)));
  }

  // 2. Rank 0 commits: verifies every rank's file, manifest, rename, latest,
  // pruning.
  absl::Status committed = absl::OkStatus();
  if (rank_ == 0) {
    for (int r = 0; r < world_; ++r) {
      const int64_t* rec = &all[static_cast<size_t>(r) * words + kStatusWords];
      FileRecord f;
      f.name = RankFileName(r);
      f.bytes = rec[0];
      f.crc32c = static_cast<uint32_t>(rec[1]);
      f.index_crc32c = static_cast<uint32_t>(rec[2]);
      for (int u = 0; u < units; ++u) f.unit_crc32c.push_back(static_cast<uint32_t>(rec[3 + u]));
      p->manifest.files.push_back(std::move(f));
    }
    committed = CommitCheckpointDirectory(p->root, p->partial_dir, p->final_dir, p->manifest,
                                          p->options.keep_last);
  }
  // 3. Everyone learns how rank 0's commit went.
  std::vector<int64_t> verdict(kStatusWords, 0);
  PackStatus(committed, verdict.data());
  services_.log().Note(CollectiveKind::kCheckpoint, -2, kStatusWords);
  ZS_RETURN_IF_ERROR(services_.HostBroadcast(verdict.data(), kStatusWords, 0));
  return UnpackStatus(verdict.data(),
                      absl::StrFormat("checkpoint %s: rank 0's commit failed: ", p->final_dir));
}

}  // namespace zeroshard::internal
