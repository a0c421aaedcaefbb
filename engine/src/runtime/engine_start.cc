// Engine::Start: every rank proves it runs the same model, layout, training
// settings, initial weights and trainer settings before the first step.
//
// Two (at most three) all-gathers, each of a size every rank knows without
// asking its peers, so that a disagreement is always reported by name and
// never shows up as a size mismatch of the exchange itself:
//   1. the header: a fixed list of named values (world size, unit and param
//      counts, spec and layout fingerprints, every TrainSpec field, the
//      number and names of the trainer's settings);
//   2. when the header matched: one fingerprint per param of its initial
//      weights and the value of every trainer setting;
//   2'. when only the model spec differed (same unit count): each unit's
//      element count and fingerprint, to say which unit differs.
// Every rank sees the same gathered data, so every rank takes the same branch.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/runtime/engine_impl.h"
#include "engine/src/runtime/fingerprint.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

// Bumped whenever the header's fields change, so that two builds with
// different headers say so instead of comparing unrelated fields.
constexpr int64_t kStartRecordVersion = 2;
// Differences listed per rank before "and N more".
constexpr size_t kMaxListed = 8;

// "optimizer.lr (rank 0: 0.001, rank 2: 0.002)" for every field where
// rank r's record differs from rank 0's.
std::vector<std::string> Differences(const std::vector<StartField>& fields,
                                     const std::vector<int64_t>& all, int r, const char* prefix) {
  const size_t n = fields.size();
  std::vector<std::string> out;
  for (size_t k = 0; k < n; ++k) {
    const int64_t mine = all[k];
    const int64_t theirs = all[static_cast<size_t>(r) * n + k];
    if (mine == theirs) continue;
    if (fields[k].kind == StartField::Kind::kHash) {
      out.push_back(absl::StrCat(prefix, fields[k].name));
    } else {
      out.push_back(absl::StrFormat("%s%s (rank 0: %s, rank %d: %s)", prefix, fields[k].name,
                                    FormatSpecValue(fields[k].kind, mine), r,
                                    FormatSpecValue(fields[k].kind, theirs)));
    }
  }
  return out;
}

std::string ListDifferences(int rank, std::vector<std::string> differences) {
  std::string more;
  if (differences.size() > kMaxListed) {
    more = absl::StrFormat(" and %d more", differences.size() - kMaxListed);
    differences.resize(kMaxListed);
  }
  return absl::StrFormat("rank %d differs from rank 0 in %s%s", rank,
                         absl::StrJoin(differences, ", "), more);
}

std::vector<int64_t> Bits(const std::vector<StartField>& fields) {
  std::vector<int64_t> bits;
  bits.reserve(fields.size());
  for (const StartField& f : fields) bits.push_back(f.bits);
  return bits;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> EngineImpl::ExchangeStartRecord(
    const std::vector<int64_t>& mine, int phase) {
  const int64_t count = static_cast<int64_t>(mine.size());
  std::vector<int64_t> all(static_cast<size_t>(count) * world_);
  log_.Note(CollectiveKind::kFingerprint, phase, count);
  ZS_RETURN_IF_ERROR(HostAllGather(mine.data(), all.data(), count));
  return all;
}

absl::Status EngineImpl::StartMismatch(const std::vector<std::string>& per_rank) const {
  return absl::FailedPreconditionError(
      absl::StrFormat("Start(): %s; every rank must run the same code with the same config, "
                      "initial weights and trainer settings",
                      absl::StrJoin(per_rank, "; ")));
}

absl::Status EngineImpl::Start(absl::Span<const TrainerSetting> settings) {
  ZS_RETURN_IF_ERROR(poisoned_);
  if (started_) return absl::FailedPreconditionError("Start() called twice");
  const int units = layout_.num_spec_units();
  // A tied alias holds its owner's values (SetParam sets the owner).
  for (int u = 0; u < units; ++u) {
    for (size_t p = 0; p < param_hashes_[u].size(); ++p) {
      if (!model_.units[u].params[p].tied_to.has_value()) continue;
      const ParamPlace place = layout_.PlaceOf(u, static_cast<int>(p));
      const ParamSlot& owner = layout_.unit(place.segment).params[place.slot];
      param_hashes_[u][p] = param_hashes_[owner.spec_unit][owner.spec_param];
    }
  }
  for (int u = 0; u < units; ++u) {
    for (size_t p = 0; p < param_hashes_[u].size(); ++p) {
      if (param_hashes_[u][p] == 0) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "Start(): param %s.%s was never set; call SetParam for every param first",
            model_.units[u].name, model_.units[u].params[p].name));
      }
    }
  }
  uint64_t settings_names = HashBytes(nullptr, 0, 0);
  for (size_t i = 0; i < settings.size(); ++i) {
    const TrainerSetting& s = settings[i];
    if (s.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Start(): trainer setting %d has no name; name every setting", i));
    }
    for (size_t j = 0; j < i; ++j) {
      if (settings[j].name == s.name) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "Start(): trainer setting '%s' is given twice; names must be unique", s.name));
      }
    }
    settings_names = HashBytes(s.name.data(), s.name.size(), settings_names);
    settings_names = HashBytes(&s.is_real, sizeof(s.is_real), settings_names);
  }

  // 1. The header.
  using Kind = StartField::Kind;
  std::vector<StartField> header = {
      {"start-up record version", Kind::kInt, kStartRecordVersion},
      {"world size", Kind::kInt, world_},
      {"model spec: number of units", Kind::kInt, units},
      {"model spec: number of params", Kind::kInt, model_.NumParams()},
      {"model spec (unit and param names, shapes, no_decay, tp_split_dim, trainable, tied_to, "
       "lr_scale, weight_decay)",
       Kind::kHash, static_cast<int64_t>(FingerprintModelSpec(model_))},
      {"layout (param offsets, padding, shards)", Kind::kHash,
       static_cast<int64_t>(FingerprintLayout(layout_))},
      {"number of trainer settings", Kind::kInt, static_cast<int64_t>(settings.size())},
      {"trainer setting names", Kind::kHash, static_cast<int64_t>(settings_names)},
  };
  const size_t model_fields = header.size();
  for (StartField& f : TrainSpecFields(train_)) {
    f.name = absl::StrCat("train spec ", f.name);
    header.push_back(std::move(f));
  }
  const int64_t count = static_cast<int64_t>(header.size());
  absl::StatusOr<std::vector<int64_t>> gathered = ExchangeStartRecord(Bits(header), -1);
  if (!gathered.ok()) {
    return absl::Status(
        gathered.status().code(),
        absl::StrFormat("Start(): the start-up check could not exchange its record (a rank with "
                        "another record size runs another zeroshard build): %s",
                        gathered.status().message()));
  }
  const std::vector<int64_t>& all = *gathered;
  std::vector<std::string> per_rank;
  bool same_unit_count = true;
  bool only_spec_differs = false;
  for (int r = 1; r < world_; ++r) {
    const std::vector<std::string> d = Differences(header, all, r, "");
    if (!d.empty()) per_rank.push_back(ListDifferences(r, d));
    same_unit_count = same_unit_count && all[static_cast<size_t>(r) * count + 2] == all[2];
  }
  if (!per_rank.empty()) {
    // Which units differ, when the unit count agrees: every rank computes
    // the same condition from the same data, so all of them gather (or not).
    only_spec_differs = same_unit_count;
    for (int r = 1; r < world_ && only_spec_differs; ++r) {
      for (size_t k = 0; k < model_fields; ++k) {
        // Params, spec and layout follow from the units themselves.
        const bool follows_from_units = k == 3 || k == 4 || k == 5;
        if (!follows_from_units && all[static_cast<size_t>(r) * count + k] != all[k]) {
          only_spec_differs = false;
        }
      }
    }
    if (only_spec_differs) {
      ZS_ASSIGN_OR_RETURN(std::vector<std::string> units_differ, UnitDifferences());
      per_rank.insert(per_rank.end(), units_differ.begin(), units_differ.end());
    }
    return Poison(StartMismatch(per_rank));
  }
  ZS_RETURN_IF_ERROR(CheckWeightsAndSettingsAgree(settings));
  // hpZ's groups: a Split, so only once every rank is known to run the same
  // TrainSpec (a rank without hpZ would not take part).
  ZS_RETURN_IF_ERROR(SetUpSecondaryGroup());
  started_ = true;
  // The first step begins here: Start's own exchanges, a Load and anything
  // reported before belong to no step.
  timeline_.BeginSteps();
  step_comm_busy_begin_ = comm_.busy_time();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> EngineImpl::UnitDifferences() {
  const int units = layout_.num_spec_units();
  std::vector<int64_t> mine;
  for (int u = 0; u < units; ++u) {
    mine.push_back(model_.units[u].NumElements());
    mine.push_back(static_cast<int64_t>(FingerprintUnitSpec(model_.units[u])));
  }
  const int64_t count = static_cast<int64_t>(mine.size());
  ZS_ASSIGN_OR_RETURN(const std::vector<int64_t> all, ExchangeStartRecord(mine, -2));
  std::vector<std::string> per_rank;
  for (int r = 1; r < world_; ++r) {
    std::vector<std::string> differences;
    for (int u = 0; u < units; ++u) {
      const size_t at = static_cast<size_t>(r) * count + 2 * u;
      if (all[at] != all[2 * u]) {
        differences.push_back(
            absl::StrFormat("unit %d ('%s' here): rank 0 has %d elements, rank %d has %d", u,
                            model_.units[u].name, all[2 * u], r, all[at]));
      } else if (all[at + 1] != all[2 * u + 1]) {
        differences.push_back(absl::StrFormat(
            "unit %d ('%s' here): same element count, but its name or its params' names, "
            "shapes, no_decay, tp_split_dim, trainable, tied_to, lr_scale or weight_decay differ",
            u, model_.units[u].name));
      }
    }
    if (!differences.empty()) per_rank.push_back(ListDifferences(r, differences));
  }
  return per_rank;
}

absl::Status EngineImpl::CheckWeightsAndSettingsAgree(absl::Span<const TrainerSetting> settings) {
  // 2. One fingerprint per param's initial weights, then the settings.
  std::vector<StartField> fields;
  for (int u = 0; u < layout_.num_spec_units(); ++u) {
    for (size_t p = 0; p < param_hashes_[u].size(); ++p) {
      fields.push_back({absl::StrFormat("initial weights of unit '%s', param '%s'",
                                        model_.units[u].name, model_.units[u].params[p].name),
                        StartField::Kind::kHash, static_cast<int64_t>(param_hashes_[u][p])});
    }
  }
  for (const TrainerSetting& s : settings) {
    fields.push_back({absl::StrCat("trainer setting ", s.name),
                      s.is_real ? StartField::Kind::kReal : StartField::Kind::kInt,
                      s.is_real ? RealBits(s.real_value) : s.int_value});
  }
  if (fields.empty()) return absl::OkStatus();
  ZS_ASSIGN_OR_RETURN(const std::vector<int64_t> all, ExchangeStartRecord(Bits(fields), -3));
  std::vector<std::string> per_rank;
  for (int r = 1; r < world_; ++r) {
    const std::vector<std::string> d = Differences(fields, all, r, "");
    if (!d.empty()) per_rank.push_back(ListDifferences(r, d));
  }
  if (per_rank.empty()) return absl::OkStatus();
  return Poison(StartMismatch(per_rank));
}

}  // namespace zeroshard::internal
