// The ParamSpec fields of frozen and tied params and param groups in the
// spec's own checks: ModelSpec::Validate's rules for lr_scale, weight_decay
// and tied_to (by name against a pairwise check on random models),
// ShardModelSpec's refusal of a tie across pipeline stages, the spec
// fingerprint's coverage of the fields, and Load's comparison of a
// checkpoint's model with the engine's (model_spec_changes.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/common/model_spec_changes.h"
#include "engine/src/common/spec_fingerprint.h"
#include "gtest/gtest.h"
#include "tests/common/model_spec_test_util.h"
#include "tests/test_seed.h"
#include "zeroshard/model_spec.h"

namespace zeroshard {
namespace {

using testing::ExpectRefused;
using testing::OneParam;

TEST(ModelSpecTest, ParamGroupFieldsAreRefusedNamingTheParam) {
  std::mt19937_64 rng(testing::Seed());
  std::uniform_real_distribution<double> positive(1e-6, 4.0);
  auto with = [](std::function<void(ParamSpec&)> change) {
    ModelSpec spec = OneParam({3, 5});
    spec.units.push_back({"head", {{"b", {5}, true}}});
    change(spec.units[1].params[0]);
    return spec;
  };
  const double bad_scale = -positive(rng);
  ExpectRefused(
      with([&](ParamSpec& p) { p.lr_scale = bad_scale; }),
      absl::StrFormat("param 'head.b' has lr_scale %g; it must be finite and >= 0", bad_scale));
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    ExpectRefused(with([&](ParamSpec& p) { p.lr_scale = bad; }), "'head.b' has lr_scale");
    ExpectRefused(with([&](ParamSpec& p) {
                    p.no_decay = false;
                    p.weight_decay = bad;
                  }),
                  "'head.b' has weight_decay");
  }
  const double bad_decay = -positive(rng);
  ExpectRefused(
      with([&](ParamSpec& p) {
        p.no_decay = false;
        p.weight_decay = bad_decay;
      }),
      absl::StrFormat("'head.b' has weight_decay %g; it must be finite and >= 0", bad_decay));
  const double decay = positive(rng);
  ExpectRefused(
      with([&](ParamSpec& p) { p.weight_decay = decay; }),
      absl::StrFormat("'head.b' has both no_decay and weight_decay %g; set one of them", decay));
  // Zero is a valid scale (a param held still) and a valid decay.
  EXPECT_TRUE(with([&](ParamSpec& p) {
                p.lr_scale = 0.0;
                p.no_decay = false;
                p.weight_decay = 0.0;
              })
                  .Validate()
                  .ok());
  EXPECT_TRUE(with([&](ParamSpec& p) {
                p.lr_scale = positive(rng);
                p.no_decay = false;
                p.weight_decay = positive(rng);
              })
                  .Validate()
                  .ok());
}

// embed (w [v, h], b), block (w), head (w tied to embed.w per `change`).
ModelSpec TiedModel(int64_t vocab, int64_t hidden) {
  ModelSpec spec;
  spec.units.push_back({"embed", {{"w", {vocab, hidden}, false}, {"b", {hidden}, true}}});
  spec.units.push_back({"block", {{"w", {hidden, hidden}, false}}});
  spec.units.push_back({"head", {{"w", {vocab, hidden}, false}}});
  spec.units[2].params[0].tied_to = ParamRef{"embed", "w"};
  return spec;
}

TEST(ModelSpecTest, StoredParamsCountATiedParamOnceAndNumParamsCountsEveryUse) {
  std::mt19937_64 rng(testing::Seed() + 5);
  const int64_t vocab = 2 + static_cast<int64_t>(rng() % 500);
  const int64_t hidden = 1 + static_cast<int64_t>(rng() % 500);
  const ModelSpec spec = TiedModel(vocab, hidden);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  // Hand count: embed.w, embed.b, block.w stored; head.w is embed.w.
  const int64_t stored = vocab * hidden + hidden + hidden * hidden;
  EXPECT_EQ(spec.NumStoredParams(), stored) << testing::SeedTrace();
  EXPECT_EQ(spec.NumParams(), stored + vocab * hidden) << testing::SeedTrace();
  ModelSpec untied = spec;
  untied.units[2].params[0].tied_to.reset();
  EXPECT_EQ(untied.NumStoredParams(), untied.NumParams());
  // A shape that wraps int64 is -1 here too, tied or not.
  ModelSpec wraps = spec;
  wraps.units[1].params[0].shape = {(int64_t{1} << 62) + 1, 4};
  EXPECT_EQ(wraps.NumStoredParams(), -1);
}

TEST(ModelSpecTest, TiesNameAnUntiedParamOfAnEarlierUnitWithTheSameShapeAndSettings) {
  std::mt19937_64 rng(testing::Seed() + 1);
  const int64_t vocab = 2 + static_cast<int64_t>(rng() % 50);
  // hidden != vocab, so that the transposed shape below is another shape.
  int64_t hidden = 1 + static_cast<int64_t>(rng() % 50);
  if (hidden == vocab) ++hidden;
  const ModelSpec good = TiedModel(vocab, hidden);
  ASSERT_TRUE(good.Validate().ok()) << good.Validate();
  auto with = [&](std::function<void(ModelSpec&)> change) {
    ModelSpec spec = good;
    change(spec);
    return spec;
  };
  ParamSpec& (*head_w)(ModelSpec&) = [](ModelSpec& s) -> ParamSpec& {
    return s.units[2].params[0];
  };
  ExpectRefused(with([&](ModelSpec& s) { head_w(s).tied_to->unit = "embedding"; }),
                "param 'head.w' is tied to 'embedding.w', which is no param of the model");
  ExpectRefused(with([&](ModelSpec& s) { head_w(s).tied_to->param = "v"; }),
                "param 'head.w' is tied to 'embed.v', which is no param of the model");
  // The owner must come first: not the unit itself, not a later one.
  ExpectRefused(with([&](ModelSpec& s) {
                  s.units[2].params.push_back({"w2", {vocab, hidden}, false});
                  head_w(s).tied_to = ParamRef{"head", "w2"};
                }),
                "param 'head.w' (unit 2) is tied to 'head.w2' of unit 2, which does not come "
                "before it");
  ExpectRefused(with([&](ModelSpec& s) {
                  head_w(s).tied_to.reset();
                  s.units[0].params[0].tied_to = ParamRef{"head", "w"};
                }),
                "param 'embed.w' (unit 0) is tied to 'head.w' of unit 2, which does not come "
                "before it");
  // No chains.
  ExpectRefused(with([&](ModelSpec& s) {
                  s.units.push_back({"head2", {{"w", {vocab, hidden}, false}}});
                  s.units[3].params[0].tied_to = ParamRef{"head", "w"};
                }),
                "param 'head2.w' is tied to 'head.w', which is itself tied to 'embed.w'; tie it "
                "to 'embed.w' directly");
  ExpectRefused(with([&](ModelSpec& s) {
                  head_w(s).shape = {hidden, vocab};
                }),
                absl::StrFormat("param 'head.w' of shape [%d, %d] is tied to 'embed.w' of shape "
                                "[%d, %d]; a tied param has its owner's shape",
                                hidden, vocab, vocab, hidden));
  ExpectRefused(with([&](ModelSpec& s) { head_w(s).shape = {vocab * hidden}; }),
                "a tied param has its owner's shape");
  // Every setting of the group and the storage must be the owner's.
  ExpectRefused(with([&](ModelSpec& s) { head_w(s).trainable = false; }),
                "'head.w' is tied to 'embed.w' but has trainable false, the owner's true");
  ExpectRefused(with([&](ModelSpec& s) { head_w(s).no_decay = true; }),
                "but has no_decay true, the owner's false");
  const double scale = std::ldexp(1.0, -static_cast<int>(rng() % 8) - 1);
  ExpectRefused(with([&](ModelSpec& s) { head_w(s).lr_scale = scale; }),
                absl::StrFormat("but has lr_scale %g, the owner's 1", scale));
  ExpectRefused(with([&](ModelSpec& s) { head_w(s).weight_decay = scale; }),
                absl::StrFormat("but has weight_decay %g, the owner's unset", scale));
  ExpectRefused(with([&](ModelSpec& s) {
                  s.units[0].params[0].weight_decay = scale;
                  head_w(s).weight_decay = 2 * scale;
                }),
                absl::StrFormat("weight_decay %g, the owner's %g", 2 * scale, scale));
  ExpectRefused(with([&](ModelSpec& s) { head_w(s).tp_split_dim = 0; }),
                "but has tp_split_dim 0, the owner's -1");
  // With the settings alike, any of them may be set.
  EXPECT_TRUE(with([&](ModelSpec& s) {
                for (ParamSpec* p : {&s.units[0].params[0], &head_w(s)}) {
                  p->trainable = false;
                  p->lr_scale = scale;
                  p->weight_decay = 2 * scale;
                  p->tp_split_dim = 1;
                }
              })
                  .Validate()
                  .ok());
  // Several aliases of one owner.
  EXPECT_TRUE(with([&](ModelSpec& s) {
                s.units[1].params.push_back({"w_in", {vocab, hidden}, false});
                s.units[1].params.back().tied_to = ParamRef{"embed", "w"};
              })
                  .Validate()
                  .ok());
}

// The rules of Validate for ties, checked the slow way (every pair) on
// random models of a few units whose params are tied at random, some of
// them wrongly: both must agree on every model.
bool TiesValidSlowly(const ModelSpec& spec) {
  for (size_t u = 0; u < spec.units.size(); ++u) {
    for (const ParamSpec& alias : spec.units[u].params) {
      if (!alias.tied_to) continue;
      const ParamSpec* owner = nullptr;
      size_t owner_unit = 0;
      for (size_t v = 0; v < spec.units.size(); ++v) {
        for (const ParamSpec& p : spec.units[v].params) {
          if (spec.units[v].name == alias.tied_to->unit && p.name == alias.tied_to->param) {
            owner = &p;
            owner_unit = v;
          }
        }
      }
      if (owner == nullptr || owner_unit >= u || owner->tied_to) return false;
      if (owner->shape != alias.shape || owner->trainable != alias.trainable ||
          owner->no_decay != alias.no_decay || owner->lr_scale != alias.lr_scale ||
          owner->weight_decay != alias.weight_decay || owner->tp_split_dim != alias.tp_split_dim) {
        return false;
      }
    }
  }
  return true;
}

TEST(ModelSpecTest, TieValidationAgreesWithAPairwiseCheckOnRandomModels) {
  std::mt19937_64 rng(testing::Seed() + 2);
  int valid = 0;
  int tied = 0;
  const int trials = 3000;
  auto random_settings = [&](ParamSpec& param) {
    param.shape = {1 + static_cast<int64_t>(rng() % 2), 3};
    param.trainable = rng() % 4 != 0;
    param.lr_scale = rng() % 4 == 0 ? 0.5 : 1.0;
    if (rng() % 4 == 0) param.weight_decay = 0.25;
    param.tp_split_dim = rng() % 4 == 0 ? 1 : -1;
  };
  for (int trial = 0; trial < trials; ++trial) {
    ModelSpec spec;
    const int units = 1 + static_cast<int>(rng() % 5);
    for (int u = 0; u < units; ++u) {
      // Unique unit names, in no particular order, so that the verdict is
      // about the ties alone and the lookup cannot rely on name order.
      UnitSpec unit{"u" + std::to_string((u * 3 + trial) % 8), {}};
      const int params = 1 + static_cast<int>(rng() % 3);
      for (int p = 0; p < params; ++p) {
        ParamSpec param{"p" + std::to_string(p), {}, false};
        random_settings(param);
        if (rng() % 2 == 0) {
          // Mostly an existing earlier param (an untied one, mostly) with
          // its settings copied; some of the time one of the ways a tie
          // goes wrong.
          if (u > 0 && rng() % 8 != 0) {
            const int v = static_cast<int>(rng() % u);
            const ParamSpec* owner = &spec.units[v].params[rng() % spec.units[v].params.size()];
            param.tied_to = ParamRef{spec.units[v].name, owner->name};
            if (owner->tied_to && rng() % 4 != 0) {
              param.tied_to = owner->tied_to;
              for (const UnitSpec& earlier : spec.units) {
                for (const ParamSpec& q : earlier.params) {
                  if (earlier.name == owner->tied_to->unit && q.name == owner->tied_to->param) {
                    owner = &q;
                  }
                }
              }
            }
            param.shape = owner->shape;
            param.trainable = owner->trainable;
            param.lr_scale = owner->lr_scale;
            param.weight_decay = owner->weight_decay;
            param.tp_split_dim = owner->tp_split_dim;
            if (rng() % 6 == 0) random_settings(param);
          } else {
            param.tied_to =
                ParamRef{"u" + std::to_string(rng() % 8), "p" + std::to_string(rng() % 3)};
          }
        }
        unit.params.push_back(std::move(param));
      }
      spec.units.push_back(std::move(unit));
    }
    const bool expected = TiesValidSlowly(spec);
    const absl::Status status = spec.Validate();
    ASSERT_EQ(status.ok(), expected)
        << status << "; trial " << trial << "; " << testing::SeedTrace();
    if (!status.ok()) {
      EXPECT_NE(status.message().find("tied to"), std::string::npos) << status;
    }
    valid += expected;
    for (const UnitSpec& unit : spec.units) {
      for (const ParamSpec& p : unit.params) tied += expected && p.tied_to.has_value();
    }
  }
  std::printf("%d of %d random models valid, holding %d ties\n", valid, trials, tied);
  // Both verdicts occur often (the check is not trivially one-sided), and
  // the valid models hold ties.
  EXPECT_GT(valid, trials / 20) << testing::SeedTrace();
  EXPECT_LT(valid, trials - trials / 20) << testing::SeedTrace();
  EXPECT_GT(tied, trials / 20) << testing::SeedTrace();
}

TEST(ShardModelSpecTest, RefusesATieAcrossPipelineStages) {
  std::mt19937_64 rng(testing::Seed() + 3);
  const int64_t hidden = 4 + static_cast<int64_t>(rng() % 8);
  const ModelSpec model = TiedModel(hidden, hidden);
  // pp 1: all on one stage.
  auto one = ShardModelSpec(model, 1, 0, 1, 0);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->units[2].params[0].tied_to->unit, "embed");
  EXPECT_TRUE(one->Validate().ok());
  // pp 3: one unit per stage; the stage holding the alias refuses, the
  // others are fine.
  EXPECT_TRUE(ShardModelSpec(model, 1, 0, 3, 0).ok());
  EXPECT_TRUE(ShardModelSpec(model, 1, 0, 3, 1).ok());
  auto split = ShardModelSpec(model, 1, 0, 3, 2);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(split.status().message().find(
                "param 'head.w' is tied to 'embed.w', but pp 3 puts unit 'head' on pipeline "
                "stage 2 and unit 'embed' on an earlier one"),
            std::string::npos)
      << split.status();
}

// Start() and the manifest compare specs by this fingerprint: every new
// field changes it, and a spec that leaves them at their defaults keeps
// the fingerprint it had before they existed.
TEST(SpecFingerprintTest, CoversTrainableTiesAndParamGroups) {
  std::mt19937_64 rng(testing::Seed() + 4);
  const int64_t hidden = 1 + static_cast<int64_t>(rng() % 64);
  const ModelSpec base = TiedModel(hidden + 1, hidden);
  ModelSpec untied = base;
  untied.units[2].params[0].tied_to.reset();
  const uint64_t h = internal::FingerprintModelSpec(untied);
  auto with = [&](std::function<void(ParamSpec&)> change) {
    ModelSpec spec = untied;
    change(spec.units[1].params[0]);
    return internal::FingerprintModelSpec(spec);
  };
  const double value = std::ldexp(static_cast<double>(1 + rng() % 1000), -10);
  // Defaults written out explicitly are the defaults.
  EXPECT_EQ(with([](ParamSpec& p) { p.trainable = true; }), h);
  EXPECT_EQ(with([](ParamSpec& p) { p.lr_scale = 1.0; }), h);
  std::vector<uint64_t> seen = {h, internal::FingerprintModelSpec(base)};
  seen.push_back(with([](ParamSpec& p) { p.trainable = false; }));
  seen.push_back(with([&](ParamSpec& p) { p.lr_scale = value; }));
  seen.push_back(with([&](ParamSpec& p) { p.weight_decay = value; }));
  seen.push_back(with([&](ParamSpec& p) { p.weight_decay = 0.0; }));
  seen.push_back(with([&](ParamSpec& p) { p.tied_to = ParamRef{"embed", "w"}; }));
  seen.push_back(with([&](ParamSpec& p) { p.tied_to = ParamRef{"embe", "dw"}; }));
  // One field's value cannot pass for another's.
  seen.push_back(with([&](ParamSpec& p) {
    p.lr_scale = value;
    p.weight_decay = value;
  }));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << testing::SeedTrace();
  // -0.0 is 0.0.
  EXPECT_EQ(with([](ParamSpec& p) { p.lr_scale = -0.0; }),
            with([](ParamSpec& p) { p.lr_scale = 0.0; }));
  EXPECT_EQ(with([](ParamSpec& p) { p.weight_decay = -0.0; }),
            with([](ParamSpec& p) { p.weight_decay = 0.0; }));
}

// Load's comparison of a checkpoint's model with the engine's: storage
// (trainable, ties) must match; group changes are listed, in model order,
// capped.
TEST(ModelSpecChangesTest, StorageMustMatchAndGroupChangesAreListedInModelOrder) {
  std::mt19937_64 rng(testing::Seed() + 5);
  const int64_t hidden = 2 + static_cast<int64_t>(rng() % 30);
  const ModelSpec saved = TiedModel(hidden + 3, hidden);
  EXPECT_EQ(internal::DescribeModelStorageDifference(saved, saved), "");
  EXPECT_TRUE(internal::DescribeParamGroupChanges(saved, saved).empty());
  ModelSpec mine = saved;
  mine.units[0].params[1].trainable = false;
  EXPECT_NE(internal::DescribeModelStorageDifference(saved, mine)
                .find("param 'embed.b' has trainable true in the checkpoint and false in this "
                      "engine's model"),
            std::string::npos);
  mine = saved;
  mine.units[2].params[0].tied_to->param = "b";
  EXPECT_NE(internal::DescribeModelStorageDifference(saved, mine)
                .find("param 'head.w' is tied to 'embed.w' in the checkpoint and tied to "
                      "'embed.b' in this engine's model"),
            std::string::npos);
  // Groups are not storage.
  mine = saved;
  const double scale = std::ldexp(static_cast<double>(1 + rng() % 1000), -7);
  for (UnitSpec& unit : mine.units) {
    for (ParamSpec& p : unit.params) {
      p.lr_scale = scale;
      p.no_decay = !p.no_decay;
    }
  }
  mine.units[1].params[0].no_decay = false;
  mine.units[1].params[0].weight_decay = scale;
  EXPECT_EQ(internal::DescribeModelStorageDifference(saved, mine), "");
  const std::string s = absl::StrFormat("%.10g", scale);  // exact: k / 128
  const std::vector<std::string> all = internal::DescribeParamGroupChanges(saved, mine);
  EXPECT_EQ(all, (std::vector<std::string>{
                     "embed.w: lr_scale 1 -> " + s, "embed.w: no_decay false -> true",
                     "embed.b: lr_scale 1 -> " + s, "embed.b: no_decay true -> false",
                     "block.w: lr_scale 1 -> " + s, "block.w: weight_decay unset -> " + s,
                     "head.w: lr_scale 1 -> " + s, "head.w: no_decay false -> true"}))
      << testing::SeedTrace();
  const std::vector<std::string> capped = internal::DescribeParamGroupChanges(saved, mine, 3);
  EXPECT_EQ(capped,
            (std::vector<std::string>{all[0], all[1], all[2], "and 5 more param group changes"}));
}

}  // namespace
}  // namespace zeroshard
