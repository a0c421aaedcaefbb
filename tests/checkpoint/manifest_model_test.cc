// The model in a checkpoint's manifest with frozen and tied params and param
// groups: written only where a param differs from the defaults (so that the
// manifests of models without them stay byte for byte what they were, and
// manifests written before them still parse), read back exactly, and
// refused, naming the param, when a value is bad.
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/src/checkpoint/format.h"
#include "engine/src/common/spec_fingerprint.h"
#include "engine/src/layout/flat_layout.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

using json = nlohmann::json;
using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

// A manifest of `model` on one rank, every count derived from its layout.
Manifest ManifestOf(const ModelSpec& model) {
  Manifest m;
  m.model = model;
  m.model_fingerprint = FingerprintModelSpec(model);
  absl::StatusOr<FlatLayout> layout = FlatLayout::Create(model, 1);
  EXPECT_TRUE(layout.ok()) << layout.status();
  FileRecord file;
  file.name = RankFileName(0);
  for (int u = 0; u < layout->num_units(); ++u) {
    m.used_numel.push_back(layout->unit(u).used_numel);
    m.shard_numel.push_back(layout->unit(u).shard_numel);
    file.unit_crc32c.push_back(static_cast<uint32_t>(u));
  }
  file.bytes = FileBytes(m.shard_numel, m.chunk_elements);
  m.files.push_back(file);
  m.trainer_state = "{}";
  return m;
}

// An embedding, blocks with a frozen weight and a scaled adapter, and a
// head tied to the embedding; the group values from `rng`.
ModelSpec RandomGroupedModel(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> real(0.0, 3.0);
  const int64_t vocab = 4 + static_cast<int64_t>(rng() % 60);
  const int64_t hidden = 1 + static_cast<int64_t>(rng() % 24);
  ModelSpec spec;
  spec.units.push_back({"embed", {{"w", {vocab, hidden}, false}, {"norm", {hidden}, true}}});
  spec.units[0].params[0].lr_scale = real(rng);
  spec.units[0].params[0].weight_decay = real(rng);
  const int blocks = 1 + static_cast<int>(rng() % 3);
  for (int b = 0; b < blocks; ++b) {
    UnitSpec block{absl::StrCat("block.", b), {}};
    block.params.push_back({"w", {hidden, hidden}, false});
    block.params.back().trainable = false;
    block.params.push_back({"lora_a", {1 + static_cast<int64_t>(rng() % 4), hidden}, false});
    block.params.back().lr_scale = real(rng);
    block.params.back().weight_decay = 0.0;
    block.params.push_back({"bias", {hidden}, true});
    spec.units.push_back(block);
  }
  UnitSpec head{"head", {{"w", {vocab, hidden}, false}}};
  head.params[0].lr_scale = spec.units[0].params[0].lr_scale;
  head.params[0].weight_decay = spec.units[0].params[0].weight_decay;
  head.params[0].tied_to = ParamRef{"embed", "w"};
  spec.units.push_back(head);
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
  return spec;
}

void ExpectSameParams(const ModelSpec& got, const ModelSpec& want) {
  ASSERT_EQ(got.units.size(), want.units.size());
  for (size_t u = 0; u < want.units.size(); ++u) {
    ASSERT_EQ(got.units[u].params.size(), want.units[u].params.size());
    for (size_t p = 0; p < want.units[u].params.size(); ++p) {
      const ParamSpec& a = got.units[u].params[p];
      const ParamSpec& b = want.units[u].params[p];
      SCOPED_TRACE(absl::StrCat(want.units[u].name, ".", b.name, "; ", SeedTrace()));
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.shape, b.shape);
      EXPECT_EQ(a.no_decay, b.no_decay);
      EXPECT_EQ(a.trainable, b.trainable);
      EXPECT_EQ(a.lr_scale, b.lr_scale);
      EXPECT_EQ(a.weight_decay, b.weight_decay);
      ASSERT_EQ(a.tied_to.has_value(), b.tied_to.has_value());
      if (b.tied_to) {
        EXPECT_EQ(a.tied_to->unit, b.tied_to->unit);
        EXPECT_EQ(a.tied_to->param, b.tied_to->param);
      }
    }
  }
}

TEST(ManifestModelTest, FrozenTiedAndGroupedParamsRoundTripExactly) {
  std::mt19937_64 rng(Seed());
  for (int trial = 0; trial < 20; ++trial) {
    const ModelSpec model = RandomGroupedModel(rng);
    const std::string text = ManifestToJson(ManifestOf(model));
    absl::StatusOr<Manifest> back = ParseManifest(text, "manifest.json");
    ASSERT_TRUE(back.ok()) << back.status() << "; " << SeedTrace();
    ExpectSameParams(back->model, model);
    EXPECT_EQ(back->model_fingerprint, FingerprintModelSpec(model));
    EXPECT_EQ(ManifestToJson(*back), text) << SeedTrace();
    // The written keys: the new ones only where a param has them.
    const json doc = json::parse(text);
    const json& head = doc["model"]["units"].back()["params"][0];
    EXPECT_EQ(head["tied_to"], (json{{"unit", "embed"}, {"param", "w"}}));
    const json& block = doc["model"]["units"][1]["params"];
    EXPECT_EQ(block[0]["trainable"], false);
    EXPECT_EQ(block[1]["weight_decay"], 0.0);
    for (const char* key : {"trainable", "tied_to", "lr_scale", "weight_decay"}) {
      EXPECT_FALSE(block[2].contains(key)) << key << ": " << block[2].dump();
    }
  }
}

// A manifest written before these fields existed (the fuzz corpus keeps one
// an engine wrote) parses, and its model is written back byte for byte.
TEST(ManifestModelTest, ManifestsWithoutTheNewFieldsParseAndRewriteTheirModelUnchanged) {
  const std::string path = std::string(ZS_MANIFEST_CORPUS) + "/written-1ranks-stage0-fp32.json";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  // The corpus keeps manifests without their checksum (for the fuzzer).
  absl::StatusOr<Manifest> m = ParseManifestContent(text.str(), path);
  ASSERT_TRUE(m.ok()) << m.status();
  for (const UnitSpec& unit : m->model.units) {
    for (const ParamSpec& p : unit.params) {
      EXPECT_TRUE(p.trainable);
      EXPECT_FALSE(p.tied_to.has_value());
      EXPECT_EQ(p.lr_scale, 1.0);
      EXPECT_FALSE(p.weight_decay.has_value());
    }
  }
  // Parsing checked the recorded fingerprint against the spec's: the
  // fingerprint of a model without the new fields is what it was.
  const json old_doc = json::parse(text.str());
  const json new_doc = json::parse(ManifestToJson(*m));
  EXPECT_EQ(new_doc["model"].dump(1), old_doc["model"].dump(1));
}

TEST(ManifestModelTest, BadValuesAreRefusedNamingTheParam) {
  std::mt19937_64 rng(Seed() + 1);
  const ModelSpec model = RandomGroupedModel(rng);
  const json good = json::parse(ManifestToJson(ManifestOf(model)));
  auto parse_edited = [&](const std::function<void(json & params)>& edit) {
    json doc = good;
    doc.erase("manifest_crc32c");
    edit(doc["model"]["units"][1]["params"]);  // block.0
    return ParseManifestContent(doc.dump(), "manifest.json").status();
  };
  auto expect = [](const absl::Status& status, const std::string& needle) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status << "; " << SeedTrace();
  };
  expect(parse_edited([](json& p) { p[1]["lr_scale"] = -0.5; }),
         "manifest.json: field 'model': model spec: param 'block.0.lora_a' has lr_scale -0.5");
  expect(parse_edited([](json& p) { p[2]["weight_decay"] = 0.1; }),
         "param 'block.0.bias' has both no_decay and weight_decay 0.1");
  expect(parse_edited([](json& p) { p[1]["weight_decay"] = -1; }),
         "param 'block.0.lora_a' has weight_decay -1");
  expect(parse_edited([](json& p) { p[0]["trainable"] = "no"; }),
         "manifest.json: field 'model.units[1].params[0].trainable' is \"no\"; it must be true or "
         "false");
  expect(parse_edited([](json& p) {
           p[0]["tied_to"] = {{"unit", "head"}, {"param", "w"}};
         }),
         "param 'block.0.w' (unit 1) is tied to 'head.w' of unit");
  expect(parse_edited([](json& p) {
           p[0]["tied_to"] = {{"unit", "embed"}};
         }),
         "field 'model.units[1].params[0].tied_to.param' is missing");
  // An edit that keeps the spec valid is caught by the fingerprint.
  const absl::Status other_scale = parse_edited([](json& p) { p[1]["lr_scale"] = 0.25; });
  expect(other_scale, "field 'model.fingerprint'");
}

}  // namespace
}  // namespace zeroshard::internal
