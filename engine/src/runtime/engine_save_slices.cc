// Engine::SaveSlices: a model-parallel shard's part of one checkpoint of the
// whole model (docs/checkpoint.md, "Grid checkpoints").
//
// Each rank snapshots its engine's shard (Save's snapshot, in its own
// segment coordinates), maps every element it writes to the whole model's
// segment coordinates through its params' origins (SliceRuns), and sends
// each piece to the world rank that owns it in the whole model's layout
// over world.size() ranks. Each world rank then writes the rank file of
// that layout with the ordinary writer, whose collectives run over the
// world (WorldServices): the result is an ordinary checkpoint of `whole`.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/runtime/engine_impl.h"
#include "engine/src/runtime/fingerprint.h"
#include "engine/src/runtime/slice_reader.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

// Point-to-point tags on the world for the exchange.
constexpr uint64_t kRunsTag = 0x5A53'0001;
constexpr uint64_t kValuesTag = 0x5A53'0002;

// The origins' fit to `whole` (CheckSliceShape per param), and their count.
absl::Status CheckOrigins(
    const ModelSpec& model, const ModelSpec& whole,
    const std::vector<std::vector<ParamOrigin>>& origins,
    std::map<std::pair<std::string, std::string>, std::pair<int, int>>* index) {
  for (size_t u = 0; u < whole.units.size(); ++u) {
    for (size_t p = 0; p < whole.units[u].params.size(); ++p) {
      (*index)[{whole.units[u].name, whole.units[u].params[p].name}] = {static_cast<int>(u),
                                                                        static_cast<int>(p)};
    }
  }
  if (origins.size() != model.units.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SaveSlices: %d units of origins for a model of %d units", origins.size(),
                        model.units.size()));
  }
  for (size_t u = 0; u < model.units.size(); ++u) {
    const UnitSpec& unit = model.units[u];
    if (origins[u].size() != unit.params.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("SaveSlices: unit '%s' has %d params but %d origins", unit.name,
                          unit.params.size(), origins[u].size()));
    }
    for (size_t p = 0; p < unit.params.size(); ++p) {
      if (unit.params[p].tied_to.has_value()) continue;  // stored with its owner
      const ParamOrigin& o = origins[u][p];
      const std::string what = absl::StrFormat("SaveSlices: %s.%s", unit.name, unit.params[p].name);
      auto found = index->find({o.unit, o.param});
      if (found == index->end()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: the whole model has no param %s.%s", what, o.unit, o.param));
      }
      const ParamSpec& w = whole.units[found->second.first].params[found->second.second];
      ZS_RETURN_IF_ERROR(CheckSliceShape(unit.params[p].shape, w.shape, o, what));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EngineImpl::SaveSlices(const std::string& dir, const std::string& trainer_state,
                                    const ModelSpec& whole,
                                    const std::vector<std::vector<ParamOrigin>>& origins,
                                    Communicator& world, const CheckpointOptions& options) {
  StepTimeline::Call call(timeline_);
  const std::string state = trainer_state.empty() ? "{}" : trainer_state;
  int64_t state_bytes = 0;
  absl::Status local = CheckSaveCall("SaveSlices", dir, state, options, &state_bytes);
  std::map<std::pair<std::string, std::string>, std::pair<int, int>> index;
  const absl::Status whole_ok = whole.Validate();
  if (local.ok()) local = whole_ok;
  if (local.ok()) local = CheckOrigins(model_, whole, origins, &index);
  if (local.ok() && world.memory_kind() != DeviceKind::kCpu) {
    local = absl::UnimplementedError(
        "SaveSlices: the world communicator moves device memory; grid checkpoints need a host "
        "memory world (local, mpi)");
  }
  if (!started_) return local;
  ZS_RETURN_IF_ERROR(WaitForCheckpoint());
  // The writer for this whole model and world (kept between saves). Made
  // even when `local` is an error, so that this rank takes part in the
  // directory check that reports it on every rank.
  if (whole_ok.ok() && (slices_ == nullptr || slices_->world != &world ||
                        FingerprintModelSpec(slices_->whole) != FingerprintModelSpec(whole))) {
    slices_.reset();
    absl::StatusOr<FlatLayout> layout = FlatLayout::Create(whole, world.size());
    if (layout.ok()) {
      auto slices = std::make_unique<SliceCheckpoint>();
      slices->whole = whole;
      slices->layout = std::move(*layout);
      slices->world = &world;
      RuntimeServices& engine_services = *this;  // a private base
      slices->services = std::make_unique<WorldServices>(engine_services, world);
      slices->writer = std::make_unique<CheckpointWriter>(
          slices->layout, world.rank(), mixed_, param_dtype_, buffers_, *slices->services);
      slices_ = std::move(slices);
    } else if (local.ok()) {
      local = layout.status();
    }
  }
  if (slices_ == nullptr) {
    // Without a writer this rank cannot take part in the directory check;
    // the other ranks' collectives time out naming it.
    return local.ok() ? absl::InternalError("SaveSlices: no writer for the whole model") : local;
  }
  Manifest m = StateManifest(state);
  m.world_size = world.size();
  m.model = whole;
  for (UnitSpec& unit : m.model.units) {
    for (ParamSpec& param : unit.params) param.tp_split_dim = -1;
  }
  m.model_fingerprint = FingerprintModelSpec(m.model);
  const FlatLayout& layout = slices_->layout;
  for (int u = 0; u < layout.num_units(); ++u) {
    m.used_numel.push_back(layout.unit(u).used_numel);
    m.shard_numel.push_back(layout.unit(u).shard_numel);
  }
  slices_->writer->set_snapshot_source(
      [this, &origins](std::vector<float>* out) { return GatherWholeShard(origins, out); });
  const absl::Status begun = slices_->writer->Begin(dir, options, std::move(m), local, state_bytes);
  slices_->writer->set_snapshot_source(nullptr);
  ZS_RETURN_IF_ERROR(begun);
  if (!options.background) return WaitForCheckpoint();
  return absl::OkStatus();
}

absl::Status EngineImpl::PrepareCheckpointDirectory(const std::string& dir, Communicator& world) {
  StepTimeline::Call call(timeline_);
  ZS_RETURN_IF_ERROR(poisoned_);
  absl::Status local =
      started_ ? CheckBetweenSteps("PrepareCheckpointDirectory") : absl::OkStatus();
  if (local.ok() && dir.empty()) {
    local = absl::InvalidArgumentError("the checkpoint directory is empty");
  }
  if (world.memory_kind() != DeviceKind::kCpu) {
    return absl::UnimplementedError(
        "PrepareCheckpointDirectory: the world communicator moves device memory; grid "
        "checkpoints need a host memory world (local, mpi)");
  }
  // A writer whose collectives run over the world, for the check only.
  RuntimeServices& engine_services = *this;  // a private base
  WorldServices services(engine_services, world);
  CheckpointWriter writer(layout_, world.rank(), mixed_, param_dtype_, buffers_, services);
  return writer.CheckSharedDirectory(dir, dir, /*fresh=*/false, local,
                                     "PrepareCheckpointDirectory");
}

absl::Status EngineImpl::GatherWholeShard(const std::vector<std::vector<ParamOrigin>>& origins,
                                          std::vector<float>* out) {
  Communicator& world = *slices_->world;
  const FlatLayout& whole_layout = slices_->layout;
  const ModelSpec& whole = slices_->whole;
  const int me = world.rank();
  const int ranks = world.size();
  std::map<std::pair<std::string, std::string>, std::pair<int, int>> index;
  for (size_t u = 0; u < whole.units.size(); ++u) {
    for (size_t p = 0; p < whole.units[u].params.size(); ++p) {
      index[{whole.units[u].name, whole.units[u].params[p].name}] = {static_cast<int>(u),
                                                                     static_cast<int>(p)};
    }
  }
  // 1. This engine's shard, in its own segments (Save's snapshot).
  std::vector<float> mine;
  ZS_RETURN_IF_ERROR(checkpoint_->Snapshot(&mine));

  // 2. Its pieces, per destination: (whole segment, offset, count) and the
  // values (master, m, v of each piece in turn).
  std::vector<std::vector<int64_t>> runs(ranks);
  std::vector<std::vector<float>> values(ranks);
  int64_t base = 0;  // of segment s in `mine`
  for (int s = 0; s < layout_.num_units(); ++s) {
    const ElementRange shard = layout_.ShardRange(s, rank_);
    const int64_t n = shard.size();
    for (const ParamSlot& slot : layout_.unit(s).params) {
      const ParamSpec& spec = model_.units[slot.spec_unit].params[slot.spec_param];
      // One rank of a tp group writes a replicated param.
      if (spec.tp_split_dim < 0 && parallel_.group != nullptr && !parallel_.count_replicated) {
        continue;
      }
      const ParamOrigin& origin = origins[slot.spec_unit][slot.spec_param];
      const auto [wu, wp] = index.at({origin.unit, origin.param});
      // A replica of a tied alias: its owner writes the values.
      if (whole.units[wu].params[wp].tied_to.has_value()) continue;
      const int64_t begin = std::max(shard.begin, slot.offset);
      const int64_t end = std::min(shard.end, slot.offset + slot.numel);
      if (begin >= end) continue;
      const ParamPlace place = whole_layout.PlaceOf(wu, wp);
      const UnitSegment& wseg = whole_layout.unit(place.segment);
      const int64_t woffset = wseg.params[place.slot].offset;
      for (const SliceRun& r : SliceRuns(spec.shape, whole.units[wu].params[wp].shape, origin,
                                         begin - slot.offset, end - slot.offset)) {
        int64_t coord = woffset + r.source;  // whole segment coordinates
        int64_t from = base + (slot.offset + r.local - shard.begin);
        int64_t left = r.valid;
        while (left > 0) {
          const int dest = static_cast<int>(coord / wseg.shard_numel);
          const int64_t take = std::min(left, (dest + 1) * wseg.shard_numel - coord);
          runs[dest].insert(runs[dest].end(), {place.segment, coord, take});
          for (int t = 0; t < kTensorsPerUnit; ++t) {
            const float* src = mine.data() + from + t * n;
            values[dest].insert(values[dest].end(), src, src + take);
          }
          coord += take;
          from += take;
          left -= take;
        }
      }
    }
    base += kTensorsPerUnit * n;
  }

  // 3. Who sends whom how much, then the pieces (this rank's own: kept).
  std::vector<int64_t> sizes(2 * ranks), all(static_cast<size_t>(2 * ranks) * ranks);
  for (int d = 0; d < ranks; ++d) {
    sizes[2 * d] = static_cast<int64_t>(runs[d].size());
    sizes[2 * d + 1] = static_cast<int64_t>(values[d].size());
  }
  ZS_RETURN_IF_ERROR(slices_->services->HostAllGather(sizes.data(), all.data(), 2 * ranks));
  std::vector<std::vector<int64_t>> runs_in(ranks);
  std::vector<std::vector<float>> values_in(ranks);
  std::vector<CommHandle> handles;
  for (int src = 0; src < ranks; ++src) {
    const int64_t nruns = all[static_cast<size_t>(src) * 2 * ranks + 2 * me];
    const int64_t nvalues = all[static_cast<size_t>(src) * 2 * ranks + 2 * me + 1];
    if (src == me || nruns == 0) continue;
    runs_in[src].resize(static_cast<size_t>(nruns));
    values_in[src].resize(static_cast<size_t>(nvalues));
    handles.push_back(world.Recv(runs_in[src].data(), nruns, DType::kInt64, src, kRunsTag));
    handles.push_back(world.Recv(values_in[src].data(), nvalues, DType::kFloat32, src, kValuesTag));
  }
  for (int d = 0; d < ranks; ++d) {
    if (d == me || runs[d].empty()) continue;
    handles.push_back(world.Send(runs[d].data(), static_cast<int64_t>(runs[d].size()),
                                 DType::kInt64, d, kRunsTag));
    handles.push_back(world.Send(values[d].data(), static_cast<int64_t>(values[d].size()),
                                 DType::kFloat32, d, kValuesTag));
  }
  absl::Status exchanged = absl::OkStatus();
  for (CommHandle& h : handles) {
    absl::Status s = WaitComm(h, WaitSite::kSave);
    if (exchanged.ok()) exchanged = s;
  }
  ZS_RETURN_IF_ERROR(exchanged);
  runs_in[me] = std::move(runs[me]);
  values_in[me] = std::move(values[me]);

  // 4. This rank's shard of the whole model, in the rank file's order;
  // every element of a param written exactly once.
  out->assign(static_cast<size_t>(whole_layout.shard_numel()) * kTensorsPerUnit, 0.0f);
  std::vector<int64_t> out_base(whole_layout.num_units());
  std::vector<char> written(static_cast<size_t>(whole_layout.shard_numel()), 0);
  std::vector<int64_t> written_base(whole_layout.num_units());
  for (int s = 0, b = 0, w = 0; s < whole_layout.num_units(); ++s) {
    out_base[s] = b;
    written_base[s] = w;
    b += kTensorsPerUnit * whole_layout.unit(s).shard_numel;
    w += whole_layout.unit(s).shard_numel;
  }
  int64_t twice = 0;
  for (int src = 0; src < ranks; ++src) {
    const std::vector<int64_t>& r = runs_in[src];
    const float* v = values_in[src].data();
    for (size_t i = 0; i + 2 < r.size(); i += 3) {
      const int seg = static_cast<int>(r[i]);
      const int64_t shard = whole_layout.unit(seg).shard_numel;
      const int64_t at = r[i + 1] - static_cast<int64_t>(me) * shard;
      const int64_t count = r[i + 2];
      for (int t = 0; t < kTensorsPerUnit; ++t) {
        std::copy(v, v + count, out->data() + out_base[seg] + t * shard + at);
        v += count;
      }
      for (int64_t k = 0; k < count; ++k) {
        char& mark = written[static_cast<size_t>(written_base[seg] + at + k)];
        twice += mark;
        mark = 1;
      }
    }
  }
  // Every param element of this shard, and nothing else, once.
  int64_t expected = 0, got = 0;
  for (int s = 0; s < whole_layout.num_units(); ++s) {
    const ElementRange shard = whole_layout.ShardRange(s, me);
    for (const ParamSlot& slot : whole_layout.unit(s).params) {
      expected += std::max<int64_t>(
          0, std::min(shard.end, slot.offset + slot.numel) - std::max(shard.begin, slot.offset));
    }
  }
  for (char c : written) got += c;
  if (got != expected || twice != 0) {
    return absl::InternalError(absl::StrFormat(
        "SaveSlices: world rank %d's shard of the whole model got %d of its %d param elements "
        "(%d written twice): the ranks' origins do not cover the model exactly once (is every "
        "position of the grid saving, with the same whole model?)",
        me, got, expected, twice));
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::internal
