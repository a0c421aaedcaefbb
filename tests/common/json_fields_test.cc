// JsonFields and ModelUnitsFromJson: the one field reader (and its one error
// wording) of the spec file, the HF config and the checkpoint manifest, and
// the one reader of a ModelSpec's units from JSON. Values from the test
// seed; the expected specs are built by hand from the same numbers.
#include "engine/src/common/json_fields.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"

namespace zeroshard::internal {
namespace {

using json = nlohmann::json;
using ::zeroshard::testing::Seed;
using ::zeroshard::testing::SeedTrace;

void ExpectError(const absl::Status& status, const std::string& message) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(std::string(status.message()), message);
}

TEST(JsonFieldsTest, EveryErrorNamesTheSourceTheFieldItsValueAndWhatItMustBe) {
  const json doc = json::parse(R"({"n": 7, "big": 18446744073709551615, "neg": -3, "s": "x",
      "b": true, "r": 0.5, "nul": null, "o": {"k": "v"}})");
  const JsonFields f(doc, "c.json", "top.");
  ExpectError(f.Int("missing").status(), "c.json: field 'top.missing' is missing; it is required");
  ExpectError(f.Int("nul").status(), "c.json: field 'top.nul' is missing; it is required");
  ExpectError(f.Int("s").status(), "c.json: field 'top.s' is \"x\"; it must be an integer");
  ExpectError(f.Int("r").status(), "c.json: field 'top.r' is 0.5; it must be an integer");
  ExpectError(f.Real("s").status(), "c.json: field 'top.s' is \"x\"; it must be a number");
  ExpectError(f.String("n").status(), "c.json: field 'top.n' is 7; it must be a string");
  ExpectError(f.Bool("n").status(), "c.json: field 'top.n' is 7; it must be true or false");
  ExpectError(f.Get("n", json::value_t::object).status(),
              "c.json: field 'top.n' is 7; it must be an object");
  ExpectError(f.Int("n", 0, 3).status(), "c.json: field 'top.n' is 7, outside [0, 3]");
  ExpectError(f.Int("big").status(),
              "c.json: field 'top.big' is 18446744073709551615, above 2^63 - 1; give a smaller "
              "value");
  ExpectError(f.Int("big", 0, 100).status(),
              "c.json: field 'top.big' is 18446744073709551615, outside [0, 100]");
  ExpectError(f.Size("neg").status(),
              "c.json: field 'top.neg' is -3; it must be a positive integer");
  ExpectError(f.Size("n", 5).status(),
              "c.json: top.n 7 exceeds the supported maximum 5; check the config");
  ExpectError(f.CheckKeys({"n", "big"}, "a test document"),
              "c.json: 'top' holds a field 'b' that a test document does not have (another tool "
              "or version wrote it?)");
  ExpectError(f.Child(doc.at("o"), "o").String("z").status(),
              "c.json: field 'top.o.z' is missing; it is required");
  // Present values, and fallbacks for absent (or null) ones.
  EXPECT_EQ(*f.Int("n", 7, 7), 7);
  EXPECT_EQ(*f.IntOr("nul", 11), 11);
  EXPECT_EQ(*f.SizeOr("missing", 4), 4);
  EXPECT_EQ(*f.Real("n"), 7.0);
  EXPECT_EQ(*f.RealOr("missing", 0.25), 0.25);
  EXPECT_EQ(*f.String("s"), "x");
  EXPECT_EQ(*f.Bool("b"), true);
  EXPECT_EQ(*f.BoolOr("missing", false), false);

  std::mt19937_64 rng(Seed());
  for (int k = 0; k < 100; ++k) {
    const int64_t v = static_cast<int64_t>(rng());
    const json one = {{"v", v}};
    EXPECT_EQ(*JsonFields(one, "r.json").Int("v"), v) << SeedTrace();
  }
}

// The spec file's rules (optional names and no_decay, other keys ignored)
// and the manifest's (every key required, no other key) on the same units.
TEST(JsonFieldsTest, ModelUnitsAreReadByOneReaderUnderEitherRules) {
  std::mt19937_64 rng(Seed());
  ModelSpec expected;
  json units = json::array();
  const int count = static_cast<int>(rng() % 4) + 1;
  for (int u = 0; u < count; ++u) {
    UnitSpec unit{absl::StrCat("u", rng() % 1000), {}};
    json params = json::array();
    const int n = static_cast<int>(rng() % 3) + 1;
    for (int p = 0; p < n; ++p) {
      ParamSpec param{absl::StrCat("p", p), {}, rng() % 2 == 1};
      const int dims = static_cast<int>(rng() % 3) + 1;
      for (int d = 0; d < dims; ++d) param.shape.push_back(static_cast<int64_t>(rng() % 64) + 1);
      params.push_back(
          {{"name", param.name}, {"shape", param.shape}, {"no_decay", param.no_decay}});
      unit.params.push_back(param);
    }
    units.push_back({{"name", unit.name}, {"params", params}, {"extra", u}});
    expected.units.push_back(unit);
  }
  const json doc = {{"units", units}};
  std::vector<int64_t> extras;
  UnitJsonRules strict;
  strict.strict = true;
  strict.unit_keys = {"extra"};
  for (const UnitJsonRules& rules : {UnitJsonRules{}, strict}) {
    extras.clear();
    absl::StatusOr<ModelSpec> spec = ModelUnitsFromJson(
        JsonFields(doc, "m.json"), "units", rules, [&](const JsonFields& unit, int index) {
          absl::StatusOr<int64_t> extra = unit.Int("extra");
          if (!extra.ok()) return extra.status();
          EXPECT_EQ(*extra, index);
          extras.push_back(*extra);
          return absl::OkStatus();
        });
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_EQ(spec->units.size(), expected.units.size());
    for (size_t u = 0; u < expected.units.size(); ++u) {
      EXPECT_EQ(spec->units[u].name, expected.units[u].name);
      ASSERT_EQ(spec->units[u].params.size(), expected.units[u].params.size());
      for (size_t p = 0; p < expected.units[u].params.size(); ++p) {
        EXPECT_EQ(spec->units[u].params[p].name, expected.units[u].params[p].name);
        EXPECT_EQ(spec->units[u].params[p].shape, expected.units[u].params[p].shape);
        EXPECT_EQ(spec->units[u].params[p].no_decay, expected.units[u].params[p].no_decay);
      }
    }
    EXPECT_EQ(extras.size(), expected.units.size());
  }

  // Without "no_decay": the spec file defaults it, the manifest refuses.
  json lenient = doc;
  lenient["units"][0]["params"][0].erase("no_decay");
  absl::StatusOr<ModelSpec> spec =
      ModelUnitsFromJson(JsonFields(lenient, "s.json"), "units", UnitJsonRules{});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->units[0].params[0].no_decay);
  ExpectError(ModelUnitsFromJson(JsonFields(lenient, "m.json"), "units", strict).status(),
              "m.json: field 'units[0].params[0].no_decay' is missing; it is required");
  // A key the manifest does not have: refused by the strict rules only.
  json odd = doc;
  odd["units"][0]["params"][0]["dropout"] = 0.1;
  EXPECT_TRUE(ModelUnitsFromJson(JsonFields(odd, "s.json"), "units", UnitJsonRules{}).ok());
  ExpectError(ModelUnitsFromJson(JsonFields(odd, "m.json"), "units", strict).status(),
              "m.json: 'units[0].params[0]' holds a field 'dropout' that a zeroshard manifest "
              "does not have (another tool or version wrote it?)");
  // The same wording for a bad shape under either rules.
  json bad = doc;
  bad["units"][0]["params"][0]["shape"] = {4, "x"};
  for (const UnitJsonRules& rules : {UnitJsonRules{}, strict}) {
    ExpectError(ModelUnitsFromJson(JsonFields(bad, "b.json"), "units", rules).status(),
                "b.json: field 'units[0].params[0].shape' holds \"x\"; it must be a list of "
                "integers");
  }
  ExpectError(
      ModelUnitsFromJson(JsonFields(json{{"units", json::array()}}, "e.json"), "units", strict)
          .status(),
      "e.json: field 'units' has no units; a model has at least one");
}

// The param group, freezing and tie keys: ParamSpecToJson writes each only
// when it is not the default, and ModelUnitsFromJson reads back every one
// of them under either rules, or the default when absent.
TEST(JsonFieldsTest, ParamGroupFreezeAndTieKeysRoundTripAndAreOmittedWhenDefault) {
  std::mt19937_64 rng(Seed());
  std::uniform_real_distribution<double> real(0.0, 2.0);
  ModelSpec expected;
  json units = json::array();
  const int count = static_cast<int>(rng() % 4) + 2;
  int written_keys = 0;
  for (int u = 0; u < count; ++u) {
    UnitSpec unit{absl::StrCat("u", u), {}};
    json params = json::array();
    const int n = static_cast<int>(rng() % 3) + 1;
    for (int p = 0; p < n; ++p) {
      ParamSpec param{absl::StrCat("p", p), {1 + static_cast<int64_t>(rng() % 9)}, false};
      if (rng() % 2 == 0) param.trainable = false;
      if (rng() % 2 == 0) param.lr_scale = real(rng);
      if (rng() % 2 == 0) {
        param.weight_decay = real(rng);
      } else {
        param.no_decay = rng() % 2 == 0;
      }
      if (u > 0 && rng() % 2 == 0) param.tied_to = ParamRef{"u0", absl::StrCat("p", rng() % 7)};
      const json j = ParamSpecToJson(param);
      // Exactly the keys whose values are not the defaults.
      EXPECT_EQ(j.contains("trainable"), !param.trainable);
      EXPECT_EQ(j.contains("lr_scale"), param.lr_scale != 1.0);
      EXPECT_EQ(j.contains("weight_decay"), param.weight_decay.has_value());
      EXPECT_EQ(j.contains("tied_to"), param.tied_to.has_value());
      written_keys += static_cast<int>(j.size()) - 3;
      params.push_back(j);
      unit.params.push_back(param);
    }
    units.push_back({{"name", unit.name}, {"params", params}});
    expected.units.push_back(unit);
  }
  EXPECT_GT(written_keys, 0) << SeedTrace();
  UnitJsonRules strict;
  strict.strict = true;
  for (const UnitJsonRules& rules : {UnitJsonRules{}, strict}) {
    absl::StatusOr<ModelSpec> spec =
        ModelUnitsFromJson(JsonFields(json{{"units", units}}, "m.json"), "units", rules);
    ASSERT_TRUE(spec.ok()) << spec.status();
    for (size_t u = 0; u < expected.units.size(); ++u) {
      for (size_t p = 0; p < expected.units[u].params.size(); ++p) {
        const ParamSpec& want = expected.units[u].params[p];
        const ParamSpec& got = spec->units[u].params[p];
        SCOPED_TRACE(absl::StrCat("u", u, ".p", p, "; ", SeedTrace()));
        EXPECT_EQ(got.trainable, want.trainable);
        EXPECT_EQ(got.no_decay, want.no_decay);
        EXPECT_EQ(got.lr_scale, want.lr_scale);  // exact: the JSON number round-trips
        EXPECT_EQ(got.weight_decay, want.weight_decay);
        ASSERT_EQ(got.tied_to.has_value(), want.tied_to.has_value());
        if (want.tied_to) {
          EXPECT_EQ(got.tied_to->unit, want.tied_to->unit);
          EXPECT_EQ(got.tied_to->param, want.tied_to->param);
        }
      }
    }
  }
  // A default-only param is written exactly as before these keys existed.
  EXPECT_EQ(ParamSpecToJson(ParamSpec{"w", {3, 4}, true}).dump(),
            R"({"name":"w","no_decay":true,"shape":[3,4]})");

  // Wrong types, named under either rules; an unknown key inside tied_to
  // under the manifest's only.
  auto one = [](json param) {
    param["name"] = "w";
    param["shape"] = {2};
    param["no_decay"] = false;
    return json{{"units", {{{"name", "a"}, {"params", {param}}}}}};
  };
  for (const UnitJsonRules& rules : {UnitJsonRules{}, strict}) {
    ExpectError(
        ModelUnitsFromJson(JsonFields(one({{"trainable", 0}}), "b.json"), "units", rules).status(),
        "b.json: field 'units[0].params[0].trainable' is 0; it must be true or false");
    ExpectError(
        ModelUnitsFromJson(JsonFields(one({{"lr_scale", "2"}}), "b.json"), "units", rules).status(),
        "b.json: field 'units[0].params[0].lr_scale' is \"2\"; it must be a number");
    ExpectError(
        ModelUnitsFromJson(JsonFields(one({{"weight_decay", true}}), "b.json"), "units", rules)
            .status(),
        "b.json: field 'units[0].params[0].weight_decay' is true; it must be a number");
    ExpectError(ModelUnitsFromJson(JsonFields(one({{"tied_to", "a.v"}}), "b.json"), "units", rules)
                    .status(),
                "b.json: field 'units[0].params[0].tied_to' is \"a.v\"; it must be an object");
    ExpectError(ModelUnitsFromJson(JsonFields(one({{"tied_to", {{"unit", "a"}}}}), "b.json"),
                                   "units", rules)
                    .status(),
                "b.json: field 'units[0].params[0].tied_to.param' is missing; it is required");
  }
  const json extra = one({{"tied_to", {{"unit", "a"}, {"param", "v"}, {"scale", 2}}}});
  EXPECT_TRUE(ModelUnitsFromJson(JsonFields(extra, "s.json"), "units", UnitJsonRules{}).ok());
  ExpectError(ModelUnitsFromJson(JsonFields(extra, "m.json"), "units", strict).status(),
              "m.json: 'units[0].params[0].tied_to' holds a field 'scale' that a zeroshard "
              "manifest does not have (another tool or version wrote it?)");
}

}  // namespace
}  // namespace zeroshard::internal
