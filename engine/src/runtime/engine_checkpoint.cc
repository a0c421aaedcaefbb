// Engine::Save, WaitForCheckpoint and Load (docs/checkpoint.md).
//
// Save copies this rank's shard of every unit (fp32 master, Adam m and v, in
// segment coordinates) into a host snapshot and hands it to a writer thread,
// which streams it into `<dir>/step_N.partial/rank_R.bin`. The checkpoint
// becomes complete at the next Save or WaitForCheckpoint: one all-gather
// tells every rank whether every write succeeded (with the files' sizes and
// checksums), rank 0 writes the manifest, renames the step into place and
// moves `latest`, and a broadcast tells every rank how that went.
//
// Load reads, on every rank, only the elements the rank owns in the new
// layout from the old files (whatever the old world size and stage), into
// fresh vectors; one all-gather decides, and only when every rank succeeded
// do the engine's buffers take the values.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/src/checkpoint/directory.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/checkpoint/segment_reader.h"
#include "engine/src/common/bounded_read.h"
#include "engine/src/common/train_spec_fields.h"
#include "engine/src/runtime/engine_impl.h"
#include "engine/src/runtime/fingerprint.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

// A rank's status as it travels in an all-gather: ok flag, then a message
// truncated to kMessageWords int64 words.
constexpr int kMessageWords = 48;

void PackMessage(const std::string& text, int64_t* words) {
  char bytes[kMessageWords * 8] = {};
  std::memcpy(bytes, text.data(), std::min(text.size(), sizeof(bytes) - 1));
  std::memcpy(words, bytes, sizeof(bytes));
}

std::string UnpackMessage(const int64_t* words) {
  char bytes[kMessageWords * 8 + 1] = {};
  std::memcpy(bytes, words, kMessageWords * 8);
  return std::string(bytes);
}

// A status as it travels in a collective: ok flag, code, then its message
// truncated to kMessageWords int64 words.
constexpr int kStatusWords = 2 + kMessageWords;

void PackStatus(const absl::Status& status, int64_t* words) {
  words[0] = status.ok() ? 1 : 0;
  words[1] = static_cast<int64_t>(status.code());
  PackMessage(std::string(status.message()), words + 2);
}

absl::Status UnpackStatus(const int64_t* words, const std::string& prefix) {
  if (words[0] == 1) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(words[1]),
                      absl::StrCat(prefix, UnpackMessage(words + 2)));
}

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

// What differs between the checkpoint's model and the engine's, or "".
std::string DescribeModelDifference(const ModelSpec& saved, const ModelSpec& mine) {
  if (saved.units.size() != mine.units.size()) {
    return absl::StrFormat("it has %d units, this engine's model %d", saved.units.size(),
                           mine.units.size());
  }
  for (size_t u = 0; u < saved.units.size(); ++u) {
    const UnitSpec& a = saved.units[u];
    const UnitSpec& b = mine.units[u];
    if (a.name != b.name) {
      return absl::StrFormat("its unit %d is '%s', this engine's '%s'", u, a.name, b.name);
    }
    if (a.params.size() != b.params.size()) {
      return absl::StrFormat("unit '%s' has %d params, this engine's %d", a.name, a.params.size(),
                             b.params.size());
    }
    for (size_t p = 0; p < a.params.size(); ++p) {
      const ParamSpec& x = a.params[p];
      const ParamSpec& y = b.params[p];
      if (x.name != y.name || x.shape != y.shape || x.no_decay != y.no_decay) {
        return absl::StrFormat(
            "param %d of unit '%s' is '%s' of shape [%s]%s, this engine's '%s' of shape [%s]%s", p,
            a.name, x.name, absl::StrJoin(x.shape, ", "), x.no_decay ? " (no_decay)" : "", y.name,
            absl::StrJoin(y.shape, ", "), y.no_decay ? " (no_decay)" : "");
      }
    }
  }
  return "";
}

}  // namespace

absl::Status EngineImpl::CheckBetweenSteps(const char* call) const {
  ZS_RETURN_IF_ERROR(CheckStarted(call));
  for (int u = 0; u < layout_.num_units(); ++u) {
    if (open_grad_slot_[u] != kNoGradView || reduced_count_[u] != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s in the middle of a step (unit '%s' has gradients of this step); call it after "
          "Step()",
          call, model_.units[u].name));
    }
  }
  if (held_unit_ >= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s while unit '%s' is gathered; Release it first", call, model_.units[held_unit_].name));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::CheckSharedDirectory(const std::string& root, const std::string& check_dir,
                                              bool fresh, const absl::Status& local,
                                              const char* call) {
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
    if (made.ok()) PackMessage(check_dir, &prepared[3]);
  }
  NoteCollective(CollectiveKind::kCheckpoint, -4, 1 + kStatusWords);
  ZS_RETURN_IF_ERROR(HostBroadcast(prepared.data(), 1 + kStatusWords, 0));
  if (prepared[1] != 1) {
    return UnpackStatus(&prepared[1], absl::StrCat(call, ": "));
  }
  const std::string expected = absl::StrFormat("%016x\n", static_cast<uint64_t>(prepared[0]));
  const std::string rank0_dir = UnpackMessage(&prepared[3]);

  // 2. Every rank finds that probe through its own path, and can write there.
  absl::Status mine = local;
  bool sees_another = false;  // travels with the status: every rank classifies alike
  if (mine.ok()) {
    absl::StatusOr<std::string> seen = ReadRegularFile(probe, 64, "the directory check's probe");
    if (!seen.ok() || *seen != expected) {
      sees_another = true;
      mine = absl::FailedPreconditionError(absl::StrFormat(
          "rank %d saves into %s, where %s", rank_, check_dir,
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
  NoteCollective(CollectiveKind::kCheckpoint, -5, kWords);
  ZS_RETURN_IF_ERROR(HostAllGather(mine_words.data(), all.data(), kWords));
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

absl::Status EngineImpl::PrepareCheckpointDirectory(const std::string& dir) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(poisoned_);
  absl::Status local =
      started_ ? CheckBetweenSteps("PrepareCheckpointDirectory") : absl::OkStatus();
  if (local.ok() && dir.empty()) {
    local = absl::InvalidArgumentError("the checkpoint directory is empty");
  }
  return CheckSharedDirectory(dir, dir, /*fresh=*/false, local, "PrepareCheckpointDirectory");
}

absl::Status EngineImpl::Save(const std::string& dir, const std::string& trainer_state,
                              const CheckpointOptions& options) {
  StepTimeline::Call call(timeline_);
  // What this rank can tell alone; the directory check below makes every
  // rank return the same verdict, so one rank's bad argument cannot leave
  // the others waiting in a collective.
  absl::Status local = CheckBetweenSteps("Save");
  const std::string state = trainer_state.empty() ? "{}" : trainer_state;
  if (local.ok() && dir.empty()) {
    local = absl::InvalidArgumentError("Save: the checkpoint directory is empty");
  }
  if (local.ok() && options.keep_last < 1) {
    local = absl::InvalidArgumentError(absl::StrFormat(
        "Save: keep_last %d must be >= 1 (the newest complete checkpoint is always kept)",
        options.keep_last));
  }
  int64_t state_bytes = 0;
  if (local.ok()) {
    absl::StatusOr<int64_t> measured = TrainerStateManifestBytes(state);
    if (measured.ok()) {
      state_bytes = *measured;
    } else {
      local = measured.status();
    }
  }
  if (!started_) return local;  // CheckBetweenSteps said so, on every rank alike
  // The previous checkpoint becomes complete (or reports its failure) first.
  ZS_RETURN_IF_ERROR(WaitForCheckpoint());

  auto pending = std::make_unique<PendingCheckpoint>();
  pending->root = dir;
  pending->options = options;
  pending->final_dir = JoinPath(dir, StepDirName(step_));
  pending->partial_dir = pending->final_dir + ".partial";
  Manifest& m = pending->manifest;
  m.step = step_;
  m.applied_steps = applied_steps_;
  m.skipped_steps = stats_.skipped_steps;
  m.world_size = world_;
  m.train = train_;
  m.loss_scale = loss_scale_;
  m.hysteresis_left = hysteresis_left_;
  m.clean_steps = clean_steps_;
  m.skips_at_min_scale = skips_at_min_scale_;
  // The manifest records what its JSON holds: no tensor-parallel split.
  m.model = model_;
  for (UnitSpec& unit : m.model.units) {
    for (ParamSpec& param : unit.params) param.tp_split_dim = -1;
  }
  m.model_fingerprint = FingerprintModelSpec(m.model);
  for (int u = 0; u < layout_.num_units(); ++u) {
    m.used_numel.push_back(layout_.unit(u).used_numel);
    m.shard_numel.push_back(layout_.unit(u).shard_numel);
  }
  m.trainer_state = state;
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
      CheckSharedDirectory(dir, pending->partial_dir, /*fresh=*/true, local, "Save"));

  // The snapshot: this rank's shard of each unit, master then m then v, in
  // the file's order. With fp32 the params are the master weights.
  std::vector<float>& snapshot = checkpoint_snapshot_;
  snapshot.resize(static_cast<size_t>(layout_.shard_numel()) * kTensorsPerUnit);
  float* out = snapshot.data();
  for (int u = 0; u < layout_.num_units(); ++u) {
    const ElementRange shard = layout_.ShardRange(u, rank_);
    const size_t n = static_cast<size_t>(shard.size());
    const float* master = mixed_ ? OptimizerAt(master_, u, shard.begin)
                                 : static_cast<const float*>(ParamsAt(u, shard.begin));
    const float* const tensors[kTensorsPerUnit] = {master, OptimizerAt(adam_m_, u, shard.begin),
                                                   OptimizerAt(adam_v_, u, shard.begin)};
    for (const float* tensor : tensors) {
      ZS_RETURN_IF_ERROR(CopyOnCompute(out, tensor, static_cast<int64_t>(n * sizeof(float))));
      out += n;
    }
  }
  ZS_RETURN_IF_ERROR(SyncCompute());
  PendingCheckpoint* p = pending.get();
  const std::string file = JoinPath(p->partial_dir, RankFileName(rank_));
  const int rank = rank_;
  const int world = world_;
  // The writer thread reads the snapshot; it and the rest of `pending` stay
  // unchanged until WaitForCheckpoint joins it.
  const std::vector<float>* data = &snapshot;
  p->writer = std::thread([p, file, rank, world, data] {
    absl::StatusOr<FileRecord> rec =
        WriteRankFile(file, rank, world, p->manifest.shard_numel, *data);
    if (rec.ok()) {
      p->record = *rec;
    } else {
      p->write_status = rec.status();
    }
  });
  pending_checkpoint_ = std::move(pending);
  if (!options.background) return WaitForCheckpoint();
  return absl::OkStatus();
}

absl::Status EngineImpl::WaitForCheckpoint() {
  // From Save too: the nested call counts once.
  StepTimeline::Call call(timeline_);
  if (pending_checkpoint_ == nullptr) return absl::OkStatus();
  std::unique_ptr<PendingCheckpoint> p = std::move(pending_checkpoint_);
  if (p->writer.joinable()) p->writer.join();
  if (!p->options.keep_snapshot) std::vector<float>().swap(checkpoint_snapshot_);
  ZS_RETURN_IF_ERROR(poisoned_);

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
  NoteCollective(CollectiveKind::kCheckpoint, -1, words);
  ZS_RETURN_IF_ERROR(HostAllGather(mine.data(), all.data(), words));
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
  NoteCollective(CollectiveKind::kCheckpoint, -2, kStatusWords);
  ZS_RETURN_IF_ERROR(HostBroadcast(verdict.data(), kStatusWords, 0));
  return UnpackStatus(verdict.data(),
                      absl::StrFormat("checkpoint %s: rank 0's commit failed: ", p->final_dir));
}

absl::StatusOr<CheckpointInfo> EngineImpl::Load(const std::string& path) {
  ZS_RETURN_IF_ERROR(poisoned_);
  if (started_) {
    return absl::FailedPreconditionError(
        "Load after Start(): load a checkpoint into a fresh engine, before Start, instead of "
        "SetParam");
  }
  // Each rank reads what it owns into fresh buffers; nothing of the engine
  // changes until every rank succeeded.
  const int units = layout_.num_units();
  std::vector<ElementRange> owned(units);
  std::vector<std::vector<float>> fresh(static_cast<size_t>(units) * kTensorsPerUnit);
  for (int u = 0; u < units; ++u) {
    owned[u] = OwnedRange(u);
    for (int t = 0; t < kTensorsPerUnit; ++t) {
      fresh[static_cast<size_t>(u) * kTensorsPerUnit + t].assign(
          static_cast<size_t>(owned[u].size()), 0.0f);
    }
  }
  Manifest manifest;
  std::string step_dir;
  std::string resolve_note;
  uint64_t manifest_hash = 0;
  absl::Status read = [&]() -> absl::Status {
    ZS_ASSIGN_OR_RETURN(step_dir, ResolveCheckpointWithNote(path, &resolve_note));
    ZS_ASSIGN_OR_RETURN(manifest, ReadManifest(step_dir));
    const std::string difference = DescribeModelDifference(manifest.model, model_);
    if (!difference.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("checkpoint %s belongs to another model: %s", step_dir, difference));
    }
    const OptimizerSpec& a = manifest.train.optimizer;
    const OptimizerSpec& b = train_.optimizer;
    if (!MustMatchDifferences(manifest.train, train_).empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "checkpoint %s: its optimizer is %s with beta1 %g, beta2 %g, eps %g; this engine's is "
          "%s with %g, %g, %g: the Adam moments do not carry over to another optimizer",
          step_dir, a.kind == OptimizerKind::kAdamW ? "AdamW" : "AdamL2", a.beta1, a.beta2, a.eps,
          b.kind == OptimizerKind::kAdamW ? "AdamW" : "AdamL2", b.beta1, b.beta2, b.eps));
    }
    manifest_hash = HashBytes(&manifest.step, sizeof(manifest.step), manifest.model_fingerprint);
    for (const FileRecord& f : manifest.files) {
      manifest_hash = HashBytes(&f.crc32c, sizeof(f.crc32c), manifest_hash);
    }
    // Each old rank's file holds a shard of the old layout: read from those
    // whose shards overlap what this rank owns.
    SegmentReader reader(step_dir, manifest);
    for (int u = 0; u < units; ++u) {
      float* out[kTensorsPerUnit];
      for (int t = 0; t < kTensorsPerUnit; ++t) {
        out[t] = fresh[static_cast<size_t>(u) * kTensorsPerUnit + t].data();
      }
      ZS_RETURN_IF_ERROR(reader.Read(u, owned[u].begin, owned[u].end, out));
    }
    return absl::OkStatus();
  }();

  // Every rank's verdict, and which checkpoint it read.
  const int64_t words = 3 + kMessageWords;
  std::vector<int64_t> mine(static_cast<size_t>(words), 0);
  mine[0] = read.ok() ? 1 : 0;
  mine[1] = static_cast<int64_t>(manifest_hash);
  mine[2] = static_cast<int64_t>(read.code());
  PackMessage(read.ok() ? std::string() : std::string(read.message()), &mine[3]);
  std::vector<int64_t> all(static_cast<size_t>(words) * world_);
  NoteCollective(CollectiveKind::kCheckpoint, -3, words);
  ZS_RETURN_IF_ERROR(HostAllGather(mine.data(), all.data(), words));
  if (!read.ok()) return read;
  for (int r = 0; r < world_; ++r) {
    const int64_t* rec = &all[static_cast<size_t>(r) * words];
    if (rec[0] != 1) {
      // The same code as the rank that failed, so every rank reports alike.
      return absl::Status(static_cast<absl::StatusCode>(rec[2]),
                          absl::StrFormat("Load: rank %d could not load the checkpoint, so no "
                                          "rank does: %s",
                                          r, UnpackMessage(rec + 3)));
    }
    if (rec[1] != all[1]) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Load: rank %d read another checkpoint than rank 0 (different step or files); every "
          "rank must load the same one",
          r));
    }
  }

  // Every rank succeeded: the engine takes the values (host -> device; the
  // 16-bit params converted on the host into `staging`, alive until the sync).
  std::vector<std::vector<uint16_t>> staging(static_cast<size_t>(units));
  for (int u = 0; u < units; ++u) {
    const ElementRange range = owned[u];
    const int64_t n = range.size();
    const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
    const float* master = fresh[static_cast<size_t>(u) * kTensorsPerUnit].data();
    if (mixed_)
      ZS_RETURN_IF_ERROR(CopyOnCompute(OptimizerAt(master_, u, range.begin), master, bytes));
    ZS_RETURN_IF_ERROR(
        StoreConverted(master, n, param_dtype_, ParamsAt(u, range.begin), staging[u]));
    ZS_RETURN_IF_ERROR(CopyOnCompute(OptimizerAt(adam_m_, u, range.begin),
                                     fresh[static_cast<size_t>(u) * kTensorsPerUnit + 1].data(),
                                     bytes));
    ZS_RETURN_IF_ERROR(CopyOnCompute(OptimizerAt(adam_v_, u, range.begin),
                                     fresh[static_cast<size_t>(u) * kTensorsPerUnit + 2].data(),
                                     bytes));
  }
  ZS_RETURN_IF_ERROR(SyncCompute());
  // Resident units of a sharded optimizer hold every rank's part of the
  // params: bring them together, as after a step.
  IssueParamGathers();
  ZS_RETURN_IF_ERROR(WaitParamGathers(WaitSite::kSave));
  step_ = manifest.step;
  applied_steps_ = manifest.applied_steps;
  stats_.skipped_steps = manifest.skipped_steps;
  if (train_.precision == Precision::kFp16Mixed &&
      manifest.train.precision == Precision::kFp16Mixed) {
    loss_scale_ = manifest.loss_scale;
    hysteresis_left_ = manifest.hysteresis_left;
    clean_steps_ = manifest.clean_steps;
    skips_at_min_scale_ = manifest.skips_at_min_scale;
  }
  // Start() compares initial weights by these: every rank loaded the same
  // checkpoint (checked above), so they agree.
  for (auto& unit_hashes : param_hashes_) {
    for (uint64_t& h : unit_hashes) h = manifest_hash | 1;
  }
  CheckpointInfo info;
  info.path = step_dir;
  info.note = resolve_note;
  info.step = manifest.step;
  info.world_size = manifest.world_size;
  info.zero_stage = manifest.train.zero_stage;
  info.precision = manifest.train.precision;
  info.grad_accum_steps = manifest.train.grad_accum_steps;
  info.num_params = manifest.model.NumParams();
  info.num_units = static_cast<int>(manifest.model.units.size());
  for (const FileRecord& f : manifest.files) info.file_bytes.push_back(f.bytes);
  info.trainer_state = manifest.trainer_state;
  if (manifest.world_size != world_) {
    info.changed_settings.push_back(
        absl::StrCat("world size ", manifest.world_size, " -> ", world_));
  }
  for (std::string& change :
       DescribeTrainSpecChanges(manifest.train, train_, manifest.unrecorded_train_fields)) {
    info.changed_settings.push_back(std::move(change));
  }
  return info;
}

}  // namespace zeroshard::internal
