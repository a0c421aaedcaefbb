// The GPT model's identity (GptModelIdentity): every field that fixes the
// shapes or the math is compared, by one function, on every path that takes
// weights from elsewhere. The test walks the identity's own list of fields:
// a field without a change written here fails the test, so a new field
// cannot go untested.
//  - function level: each changed field is refused by CheckSameModel (or by
//    ParseGptConfig, for a value the trainer does not compute), naming the
//    field and both values; a checkpoint written before the identity was
//    recorded is held to the one its hf_config gives;
//  - gpt_train as a user runs it: each change refused on a resume on one
//    rank, a resume on a pipeline grid (pp 2) and a tp 2 grid, and
//    --init-from, with exit 2 and the field named, before any step.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "examples/gpt/gpt_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/command_runner.h"
#include "tests/test_seed.h"

namespace zeroshard::gpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json BaseConfig() {
  return json::parse(R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
    "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 64, "vocab_size": 256,
    "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})");
}

// A change of the config for each identity field, and the word the refusal
// must name. A field that no config.json can change (the split rules of the
// grid) is changed in the recorded identity instead (`config` empty).
struct Change {
  std::function<void(json&)> config;
  std::string names;  // what the message must contain
};

const std::map<std::string, Change>& Changes() {
  static const auto* changes = new std::map<std::string, Change>{
      {"architecture", {[](json& c) { c["architectures"] = {"GPT2Model"}; }, "GPT2Model"}},
      {"n_layer", {[](json& c) { c["n_layer"] = 3; }, "n_layer is 2 there and 3"}},
      {"n_head", {[](json& c) { c["n_head"] = 4; }, "n_head is 2 there and 4"}},
      {"n_embd", {[](json& c) { c["n_embd"] = 64; }, "n_embd is 32 there and 64"}},
      {"n_positions", {[](json& c) { c["n_positions"] = 128; }, "n_positions is 64 there and 128"}},
      {"vocab_size", {[](json& c) { c["vocab_size"] = 300; }, "vocab_size is 256 there and 300"}},
      {"n_inner", {[](json& c) { c["n_inner"] = 64; }, "n_inner"}},
      {"layer_norm_epsilon",
       {[](json& c) { c["layer_norm_epsilon"] = 1e-6; }, "layer_norm_epsilon is 1e-05 there"}},
      {"activation_function",
       {[](json& c) { c["activation_function"] = "relu"; }, "activation_function"}},
      {"tie_word_embeddings",
       {[](json& c) { c["tie_word_embeddings"] = false; }, "tie_word_embeddings"}},
      {"scale_attn_weights",
       {[](json& c) { c["scale_attn_weights"] = false; }, "scale_attn_weights"}},
      {"scale_attn_by_inverse_layer_idx",
       {[](json& c) { c["scale_attn_by_inverse_layer_idx"] = true; },
        "scale_attn_by_inverse_layer_idx"}},
      {"reorder_and_upcast_attn",
       {[](json& c) { c["reorder_and_upcast_attn"] = true; }, "reorder_and_upcast_attn"}},
      {"add_cross_attention",
       {[](json& c) { c["add_cross_attention"] = true; }, "add_cross_attention"}},
      {"grid_split_rules", {nullptr, "grid_split_rules is 1 there and 2"}},
  };
  return *changes;
}

TEST(GptModelIdentityTest, EveryFieldHasAChangeAndEachIsRefused) {
  absl::StatusOr<GptConfig> base = ParseGptConfig(BaseConfig().dump(), "base.json");
  ASSERT_TRUE(base.ok()) << base.status();
  const std::string mine = GptModelIdentity(*base);
  ASSERT_TRUE(CheckSameModel(mine, mine, "ck", "cfg", "fix it").ok());
  const std::vector<std::string> fields = GptModelIdentityFields();
  EXPECT_EQ(json::parse(mine).size(), fields.size());
  for (const std::string& field : fields) {
    SCOPED_TRACE(field);
    ASSERT_EQ(Changes().count(field), 1u)
        << "the identity field " << field << " has no change in this test: add one";
    const Change& change = Changes().at(field);
    if (!change.config) {
      json recorded = json::parse(mine);
      recorded[field] = recorded[field].get<int>() + 1;
      const absl::Status s = CheckSameModel(mine, recorded.dump(), "ck", "cfg", "fix it");
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), change.names)) << s;
      continue;
    }
    json changed = BaseConfig();
    change.config(changed);
    absl::StatusOr<GptConfig> other = ParseGptConfig(changed.dump(), "changed.json");
    if (!other.ok()) {
      // A value the trainer does not compute: refused where it is read.
      EXPECT_TRUE(absl::StrContains(other.status().message(), change.names)) << other.status();
      continue;
    }
    const absl::Status s = CheckSameModel(mine, GptModelIdentity(*other), "ck", "cfg", "fix it");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), change.names)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "fix it")) << s;
  }
}

TEST(GptModelIdentityTest, ACheckpointWithoutTheIdentityIsHeldToItsConfig) {
  absl::StatusOr<GptConfig> base = ParseGptConfig(BaseConfig().dump(), "base.json");
  ASSERT_TRUE(base.ok()) << base.status();
  const json old_state = {{"windows_consumed", 8}, {"hf_config", BaseConfig()}};
  absl::StatusOr<std::string> recorded = RecordedGptModelIdentity(old_state.dump(), "ck");
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(*recorded, GptModelIdentity(*base));
  json other = BaseConfig();
  other["n_head"] = 4;
  absl::StatusOr<GptConfig> changed = ParseGptConfig(other.dump(), "h4.json");
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(CheckSameModel(*recorded, GptModelIdentity(*changed), "ck", "h4", "").ok());
  const absl::StatusOr<std::string> none =
      RecordedGptModelIdentity(json({{"windows_consumed", 8}}).dump(), "ck/step_1");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "ck/step_1")) << none.status();
}

TEST(GptModelIdentityTest, ConfigFieldsOutsideTheIdentity) {
  // initializer_range sets --seed's initialisation; dropout is named as
  // ignored (transformers' default 0.1 where a field is left out).
  json c = BaseConfig();
  c["initializer_range"] = 0.05;
  c.erase("embd_pdrop");
  c["attn_pdrop"] = 0.25;
  absl::StatusOr<GptConfig> cfg = ParseGptConfig(c.dump(), "c.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->init_std, 0.05);
  ASSERT_EQ(cfg->dropout_ignored.size(), 2u);
  EXPECT_EQ(cfg->dropout_ignored[0], "embd_pdrop 0.1 (left out: the default)");
  EXPECT_EQ(cfg->dropout_ignored[1], "attn_pdrop 0.25");
  // Weights of the wte draw with the config's std (mean of squares ~ std^2).
  const std::vector<float> wte = InitialParam(*cfg, 0, 0, zeroshard::testing::Seed());
  double sq = 0;
  for (float v : wte) sq += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(wte.size())), 0.05, 0.005);
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

TEST(GptModelIdentityTest, GptTrainRefusesEveryChangeOnEveryPath) {
  const std::string dir = zeroshard::testing::TestTempPath("identity");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string base = dir + "/base.json";
  std::ofstream(base) << BaseConfig().dump();
  const std::string common =
      absl::StrCat(" --data ", Quote(ZS_GPT_TEXT), " --seq 32 --micro-batch 2 --quiet --seed ",
                   zeroshard::testing::Seed() % 100000);
  const std::string gpt = Quote(ZS_GPT_TRAIN);
  // One whole-model checkpoint (2 ranks, stage 1) serves every resume path;
  // --save-init writes the Hugging Face directory --init-from reads.
  zeroshard::testing::CommandResult saved =
      zeroshard::testing::RunCommand(gpt + " --config " + base + common +
                                     " --ranks 2 --stage 1 --steps 2 --save-every 2"
                                     " --checkpoint-dir " +
                                     dir + "/ck --save-init " + dir + "/hf");
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  // The unchanged model resumes on each path.
  const std::vector<std::pair<std::string, std::string>> paths = {
      {"resume on 1 rank", " --ranks 1 --steps 3 --resume --checkpoint-dir " + dir + "/ck"},
      {"resume on pp 2", " --ranks 2 --pp 2 --steps 3 --resume --checkpoint-dir " + dir + "/ck"},
      {"resume on tp 2", " --ranks 2 --tp 2 --steps 3 --resume --checkpoint-dir " + dir + "/ck"},
      {"--init-from", " --ranks 1 --steps 1 --init-from " + dir + "/hf"},
  };
  for (const auto& [what, flags] : paths) {
    zeroshard::testing::CommandResult r =
        zeroshard::testing::RunCommand(gpt + " --config " + base + common + flags);
    EXPECT_EQ(r.exit_code, 0) << what << ": " << r.err;
  }
  for (const std::string& field : GptModelIdentityFields()) {
    const Change& change = Changes().at(field);
    if (!change.config) continue;  // no config.json changes it: the test above
    json changed = BaseConfig();
    change.config(changed);
    const std::string path = dir + "/" + field + ".json";
    std::ofstream(path) << changed.dump();
    for (const auto& [what, flags] : paths) {
      SCOPED_TRACE(field + ", " + what);
      zeroshard::testing::CommandResult r =
          zeroshard::testing::RunCommand(gpt + " --config " + path + common + flags);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      EXPECT_TRUE(absl::StrContains(r.err, change.names)) << r.err;
      EXPECT_FALSE(absl::StrContains(r.err, "resumed from")) << r.err;
      EXPECT_TRUE(r.out.find("final loss") == std::string::npos) << r.out;
    }
  }
  fs::remove_all(dir);
}
TEST(GptModelIdentityTest, GptTrainSaysOnceThatDropoutIsOff) {
  const std::string dir = zeroshard::testing::TestTempPath("attn_note");
  fs::create_directories(dir);
  json asks = BaseConfig();
  asks["attn_pdrop"] = 0.1;
  std::ofstream(dir + "/asks.json") << asks.dump();
  std::ofstream(dir + "/none.json") << BaseConfig().dump();
  const std::string run = Quote(ZS_GPT_TRAIN) + " --data " + Quote(ZS_GPT_TEXT) +
                          " --seq 32 --micro-batch 2 --steps 1 --quiet --ranks 2 --config ";
  zeroshard::testing::CommandResult r = zeroshard::testing::RunCommand(run + dir + "/asks.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string note = "asks for dropout (attn_pdrop 0.1); this trainer computes none";
  const size_t at = r.err.find(note);
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(note, at + 1), std::string::npos) << "said twice: " << r.err;
  r = zeroshard::testing::RunCommand(run + dir + "/none.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "asks for dropout")) << r.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zeroshard::gpt
