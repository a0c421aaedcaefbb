// The TrainSpec field table (engine/src/common/train_spec_fields.h) drives
// Start's comparison, the manifest's "train" object and Load's report of
// changed settings. For every field of the table, this test changes that
// field alone (to another valid value, drawn from the test seed) and checks
//   - the manifest written by Save records it under "train", and
//     ManifestToJson -> ParseManifest gives back every field's bits;
//   - Start on two ranks that differ in it fails naming it and both values;
//   - Load into an engine that differs in it reports "<name> <old> -> <new>"
//     (or, for the optimizer fields the Adam moments depend on, refuses).
// A field added to the table and the struct is tested here with no change
// to this file.
#include "engine/src/common/train_spec_fields.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/common/spec_fingerprint.h"
#include "engine/src/layout/flat_layout.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

ModelSpec SmallModel() {
  ModelSpec spec;
  spec.units.push_back({"embed", {{"w", {16, 8}, false}, {"b", {8}, true}}});
  spec.units.push_back({"head", {{"w", {8, 4}, false}}});
  return spec;
}

// A valid TrainSpec whose every field is away from its default, from the
// test seed. bf16, so that fp32 gradients are another valid grad_dtype.
TrainSpec RandomTrainSpec(std::mt19937_64& rng) {
  auto uniform = [&rng](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto integer = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  TrainSpec t;
  t.zero_stage = 1;
  t.precision = Precision::kBf16Mixed;
  t.optimizer.kind = integer(0, 1) == 0 ? OptimizerKind::kAdamW : OptimizerKind::kAdamL2;
  t.optimizer.lr = uniform(1e-4, 1e-2);
  t.optimizer.beta1 = uniform(0.8, 0.95);
  t.optimizer.beta2 = uniform(0.9, 0.9999);
  t.optimizer.eps = uniform(1e-9, 1e-7);
  t.optimizer.weight_decay = uniform(0.01, 0.1);
  t.schedule.kind = LrSchedule::Kind::kWarmupCosine;
  t.schedule.warmup_steps = integer(1, 5);
  t.schedule.total_steps = integer(10, 50);
  t.schedule.min_lr_ratio = uniform(0.05, 0.5);
  t.max_grad_norm = uniform(0.5, 2.0);
  t.grad_accum_steps = static_cast<int>(integer(1, 3));
  t.num_grad_buffers = static_cast<int>(integer(1, 4));
  t.prefetch_units = static_cast<int>(integer(0, 3));
  t.max_live_gather_bytes = integer(1 << 20, 1 << 21);
  t.persistent_unit_numel = integer(0, 100);
  t.loss_scale.initial_scale = static_cast<double>(int64_t{1} << integer(8, 16));
  t.loss_scale.growth_factor = uniform(1.5, 3.0);
  t.loss_scale.backoff_factor = uniform(0.25, 0.75);
  t.loss_scale.growth_interval = integer(100, 2000);
  t.loss_scale.hysteresis = static_cast<int>(integer(1, 4));
  t.loss_scale.min_scale = uniform(1.0, 4.0);
  t.loss_scale.max_skips_at_min_scale = static_cast<int>(integer(5, 30));
  t.check_collective_sequence = integer(0, 1) == 1;
  // The optimizer state on the host tier: each offload field then has
  // another valid value (grads and params host need it off the device,
  // params host needs stage 3).
  t.zero_stage = 3;
  t.offload.optimizer = MemoryTier::kHost;
  t.offload.chunk_numel = 1024 * integer(1, 64);
  return t;
}

// `base` with `field` alone set to another value that Validate accepts.
TrainSpec Changed(const TrainSpec& base, const TrainSpecField& field, std::mt19937_64& rng) {
  const int64_t bits = field.get(base);
  std::vector<int64_t> candidates;
  switch (field.kind) {
    case SpecValueKind::kInt:
      // Steps of 1024 for the fields that take multiples of it
      // (offload.chunk_numel).
      candidates = {bits + 1 + static_cast<int64_t>(rng() % 3), bits + 1, bits - 1, bits + 1024,
                    bits - 1024};
      break;
    case SpecValueKind::kReal: {
      const double v = RealOfBits(bits);
      const double f = std::uniform_real_distribution<double>(0.5, 0.9)(rng);
      candidates = {RealBits(v * f), RealBits(v / f), RealBits(v + 0.125)};
      break;
    }
    case SpecValueKind::kBool:
      candidates = {bits == 0 ? 1 : 0};
      break;
    default:  // an enum: its other values
      for (int64_t v = 0; v < 8; ++v) candidates.push_back(v);
      break;
  }
  // hpZ's group size must also divide the world sizes this test runs (1
  // and 2), which Validate cannot know.
  if (std::string(field.name) == "zeropp.secondary_partition_size")
    candidates = {bits == 0 ? 1 : 0};
  // qgZ takes 0, 8 or 4 bits only.
  if (std::string(field.name) == "zeropp.quantized_grad_bits") candidates = {8, 4, 0};
  for (int64_t c : candidates) {
    TrainSpec t = base;
    field.set(t, c);
    if (field.get(t) != bits && t.Validate().ok()) return t;
  }
  ADD_FAILURE() << "no other valid value for " << field.name << "; " << SeedTrace();
  return base;
}

// Every field, bit for bit.
void ExpectSameFields(const TrainSpec& a, const TrainSpec& b, const std::string& what) {
  for (const TrainSpecField& f : TrainSpecFieldTable()) {
    EXPECT_EQ(f.get(a), f.get(b)) << what << ": field " << f.name << "; " << SeedTrace();
  }
}

// The value at the field's path under the "train" object, or null.
const nlohmann::json* TrainJsonAt(const nlohmann::json& manifest, const TrainSpecField& field) {
  const nlohmann::json* at = &manifest.at("train");
  for (const std::string& key : std::vector<std::string>(absl::StrSplit(field.name, '.'))) {
    if (!at->is_object() || !at->contains(key)) return nullptr;
    at = &at->at(key);
  }
  return at;
}

std::vector<std::vector<float>> RandomWeights(const ModelSpec& spec, std::mt19937_64& rng) {
  std::vector<std::vector<float>> weights;
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (const UnitSpec& unit : spec.units) {
    for (const ParamSpec& p : unit.params) {
      std::vector<float> w(static_cast<size_t>(p.NumElements()));
      for (float& x : w) x = normal(rng);
      weights.push_back(std::move(w));
    }
  }
  return weights;
}

// Engines on `trains.size()` local ranks, rank r with trains[r], the same
// weights, then Start; its status (the first failing rank's).
absl::Status StartRanks(const ModelSpec& spec, const std::vector<TrainSpec>& trains,
                        const std::vector<std::vector<float>>& weights) {
  return RunLocalRanks(
      static_cast<int>(trains.size()), [&](int rank, Communicator& comm) -> absl::Status {
        auto device = CreateCpuDevice();
        ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, trains[rank], *device, comm));
        size_t k = 0;
        for (int u = 0; u < static_cast<int>(spec.units.size()); ++u) {
          for (int p = 0; p < static_cast<int>(spec.units[u].params.size()); ++p) {
            ZS_RETURN_IF_ERROR(engine->SetParam(u, p, weights[k++]));
          }
        }
        return engine->Start();
      });
}

class TrainSpecFieldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/zs_train_fields_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string dir_;
};

TEST(TrainSpecFieldTableTest, NamesAreUniqueAndEveryEnumNameParsesBack) {
  std::set<std::string> names;
  for (const TrainSpecField& f : TrainSpecFieldTable()) {
    EXPECT_TRUE(names.insert(f.name).second) << "field " << f.name << " is listed twice";
    EXPECT_EQ(FindTrainSpecField(f.name), &f);
  }
  EXPECT_EQ(FindTrainSpecField("optimizer.momentum"), nullptr);
  for (SpecValueKind kind : {SpecValueKind::kPrecision, SpecValueKind::kOptimizer,
                             SpecValueKind::kSchedule, SpecValueKind::kDType}) {
    for (int64_t v = 0; v < 3; ++v) {
      const std::string name = FormatSpecValue(kind, v);
      if (name == absl::StrCat("value ", v)) continue;  // not a value of this enum
      absl::StatusOr<int64_t> back = ParseSpecName(kind, name);
      ASSERT_TRUE(back.ok()) << name << ": " << back.status();
      EXPECT_EQ(*back, v) << name;
    }
  }
  EXPECT_EQ(FormatSpecValue(SpecValueKind::kOptimizer, 1), "AdamL2");
  EXPECT_EQ(FormatSpecValue(SpecValueKind::kSchedule, 1), "warmup-cosine");
  EXPECT_EQ(FormatSpecValue(SpecValueKind::kReal, RealBits(0.001)), "0.001");
  EXPECT_EQ(ParseSpecName(SpecValueKind::kOptimizer, "SGD").status().message(),
            "not AdamW or AdamL2");
}

TEST_F(TrainSpecFieldsTest, EveryFieldIsWrittenReadComparedAtStartAndReportedOnResume) {
  std::mt19937_64 rng(Seed());
  const ModelSpec spec = SmallModel();
  const TrainSpec base = RandomTrainSpec(rng);
  ASSERT_TRUE(base.Validate().ok()) << base.Validate() << "; " << SeedTrace();
  const std::vector<std::vector<float>> weights = RandomWeights(spec, rng);

  // A checkpoint written with `base` (one rank, step 0).
  const absl::Status saved = RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    auto device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, base, *device, comm));
    for (size_t k = 0, u = 0; u < spec.units.size(); ++u) {
      for (size_t p = 0; p < spec.units[u].params.size(); ++p, ++k) {
        ZS_RETURN_IF_ERROR(engine->SetParam(static_cast<int>(u), static_cast<int>(p), weights[k]));
      }
    }
    ZS_RETURN_IF_ERROR(engine->Start());
    ZS_RETURN_IF_ERROR(engine->Save(dir_, "{}"));
    return engine->WaitForCheckpoint();
  });
  ASSERT_TRUE(saved.ok()) << saved;
  absl::StatusOr<std::string> step_dir = ResolveCheckpoint(dir_);
  ASSERT_TRUE(step_dir.ok()) << step_dir.status();
  std::ifstream in(*step_dir + "/manifest.json");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json written = nlohmann::json::parse(text.str());
  absl::StatusOr<Manifest> manifest = ReadManifest(*step_dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_TRUE(manifest->unrecorded_train_fields.empty())
      << absl::StrJoin(manifest->unrecorded_train_fields, ", ");
  ExpectSameFields(manifest->train, base, "the manifest Save wrote");

  for (const TrainSpecField& field : TrainSpecFieldTable()) {
    SCOPED_TRACE(field.name);
    const TrainSpec changed = Changed(base, field, rng);
    const std::string was = FormatSpecValue(field.kind, field.get(base));
    const std::string now = FormatSpecValue(field.kind, field.get(changed));

    // 1. The JSON: Save recorded it; writing `changed` and reading it back
    //    gives every field's bits.
    const nlohmann::json* value = TrainJsonAt(written, field);
    ASSERT_NE(value, nullptr) << "manifest.json has no train." << field.name;
    Manifest m = *manifest;
    m.train = changed;
    const std::string json_text = ManifestToJson(m);
    absl::StatusOr<Manifest> back = ParseManifest(json_text, "manifest.json");
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameFields(back->train, changed, "ManifestToJson -> ParseManifest");
    const nlohmann::json rewritten = nlohmann::json::parse(json_text);
    const nlohmann::json* changed_value = TrainJsonAt(rewritten, field);
    ASSERT_NE(changed_value, nullptr);

    // 2. Start: rank 1 differs in this field alone.
    const absl::Status start = StartRanks(spec, {base, changed}, weights);
    EXPECT_EQ(start.code(), absl::StatusCode::kFailedPrecondition) << start;
    const std::string expected_start =
        absl::StrFormat("train spec %s (rank 0: %s, rank 1: %s)", field.name, was, now);
    EXPECT_NE(start.message().find(expected_start), std::string::npos)
        << start << "\nexpected: " << expected_start << "; " << SeedTrace();

    // 3. Load into an engine that differs in this field alone.
    std::vector<std::string> changes;
    const absl::Status load = RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
      auto device = CreateCpuDevice();
      ZS_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, changed, *device, comm));
      ZS_ASSIGN_OR_RETURN(CheckpointInfo info, engine->Load(dir_));
      changes = info.changed_settings;
      return absl::OkStatus();
    });
    const std::string expected_change = absl::StrCat(field.name, " ", was, " -> ", now);
    if (field.on_resume == OnResume::kMustMatch) {
      EXPECT_EQ(load.code(), absl::StatusCode::kInvalidArgument) << load;
      EXPECT_NE(load.message().find("the Adam moments do not carry over"), std::string::npos)
          << load;
    } else {
      ASSERT_TRUE(load.ok()) << load << "; " << SeedTrace();
      // Exactly the fields whose values differ: this one, and the effective
      // grad dtype when the precision changes it.
      std::vector<std::string> expected;
      for (const TrainSpecField& f : TrainSpecFieldTable()) {
        if (f.get(base) != f.get(changed)) {
          expected.push_back(absl::StrCat(f.name, " ", FormatSpecValue(f.kind, f.get(base)), " -> ",
                                          FormatSpecValue(f.kind, f.get(changed))));
        }
      }
      EXPECT_EQ(changes, expected) << SeedTrace();
      EXPECT_NE(std::find(changes.begin(), changes.end(), expected_change), changes.end())
          << absl::StrJoin(changes, ", ");
    }
    std::string load_text = load.ok() ? absl::StrJoin(changes, ", ") : std::string(load.message());
    if (load_text.size() > 70) load_text = "..." + load_text.substr(load_text.size() - 67);
    std::printf("%-34s json %s -> %s | start: ...%s | load: %s\n", field.name,
                value->dump().c_str(), changed_value->dump().c_str(), expected_start.c_str(),
                load_text.c_str());
  }
}

// A manifest written before a field was recorded still loads: the field is
// listed as unrecorded (and Load reports no change of it); a field every
// manifest holds is required.
TEST_F(TrainSpecFieldsTest, OlderManifestsMayLackTheFieldsAddedSince) {
  std::mt19937_64 rng(Seed());
  const ModelSpec spec = SmallModel();
  const TrainSpec base = RandomTrainSpec(rng);
  Manifest m;
  m.train = base;
  m.model = spec;
  m.model_fingerprint = FingerprintModelSpec(spec);
  absl::StatusOr<FlatLayout> layout = FlatLayout::Create(spec, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  FileRecord file;
  file.name = RankFileName(0);
  for (int u = 0; u < layout->num_units(); ++u) {
    m.used_numel.push_back(layout->unit(u).used_numel);
    m.shard_numel.push_back(layout->unit(u).shard_numel);
    file.unit_crc32c.push_back(0);
  }
  file.bytes = FileBytes(m.shard_numel, m.chunk_elements);
  m.files.push_back(file);
  m.trainer_state = "{}";
  const nlohmann::json full = nlohmann::json::parse(ManifestToJson(m));

  std::vector<std::string> newer;
  for (const TrainSpecField& field : TrainSpecFieldTable()) {
    nlohmann::json doc = full;
    doc.erase("manifest_crc32c");
    const std::vector<std::string> path = absl::StrSplit(field.name, '.');
    nlohmann::json* at = &doc["train"];
    for (size_t i = 0; i + 1 < path.size(); ++i) at = &(*at)[path[i]];
    at->erase(path.back());
    absl::StatusOr<Manifest> read = ParseManifestContent(doc.dump(), "manifest.json");
    if (field.in_every_manifest) {
      EXPECT_FALSE(read.ok()) << field.name;
      EXPECT_NE(read.status().message().find(absl::StrCat("field 'train.", field.name, "'")),
                std::string::npos)
          << read.status();
      continue;
    }
    newer.push_back(field.name);
    ASSERT_TRUE(read.ok()) << field.name << ": " << read.status();
    EXPECT_EQ(read->unrecorded_train_fields, std::vector<std::string>{field.name});
    TrainSpec defaulted = base;
    field.set(defaulted, field.get(TrainSpec()));
    ExpectSameFields(read->train, defaulted, field.name);
    // Load's report says nothing of it.
    EXPECT_TRUE(DescribeTrainSpecChanges(read->train, base, read->unrecorded_train_fields).empty())
        << absl::StrJoin(DescribeTrainSpecChanges(read->train, base, read->unrecorded_train_fields),
                         ", ");
  }
  EXPECT_FALSE(newer.empty());

  // A manifest with none of them (as version 1 wrote): every one unrecorded.
  nlohmann::json old = full;
  old.erase("manifest_crc32c");
  for (const std::string& name : newer) {
    const std::vector<std::string> path = absl::StrSplit(name, '.');
    nlohmann::json* at = &old["train"];
    for (size_t i = 0; i + 1 < path.size(); ++i) at = &(*at)[path[i]];
    at->erase(path.back());
    if (path.size() > 1 && at->empty()) old["train"].erase(path[0]);
  }
  absl::StatusOr<Manifest> read = ParseManifestContent(old.dump(), "manifest.json");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->unrecorded_train_fields, newer);
}

}  // namespace
}  // namespace zeroshard::internal
