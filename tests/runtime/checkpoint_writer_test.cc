// CheckpointWriter on its own (no engine), on 2 ranks: a checkpoint begun
// and committed holds in every rank's file exactly the shard values set
// here (master, m, v per unit), `latest` names the newest step, retention
// keeps keep_last steps, and a failed rank fails every rank's commit.
#include "engine/src/runtime/checkpoint_writer.h"

#include <stdlib.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/checkpoint/directory.h"
#include "engine/src/checkpoint/file_ops.h"
#include "engine/src/common/spec_fingerprint.h"
#include "engine/src/plan/buffer_plan.h"
#include "gtest/gtest.h"
#include "tests/runtime/runtime_test_services.h"
#include "tests/test_seed.h"

namespace zeroshard::testing {
namespace {

using internal::ElementRange;
using internal::FlatLayout;
using internal::Manifest;

// The value of element i of tensor t (master, m, v) of unit u at `step`.
float Value(uint64_t seed, int64_t step, int t, int u, int64_t i) {
  return static_cast<float>((seed + 1000003 * step + 7919 * t + 104729 * u + 3 * i) % 100000) /
         64.0f;
}

TEST(CheckpointWriterTest, CommitsEveryRanksShardLatestAndRetention) {
  char tmpl[] = "/tmp/zs_checkpoint_writer_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = std::string(tmpl) + "/ckpt";
  const uint64_t seed = Seed();
  std::mt19937_64 rng(seed);
  const ModelSpec model = RandomModel(rng, 4);
  constexpr int kWorld = 2;
  TrainSpec train;
  train.zero_stage = 1;
  const absl::Status run = RunLocalRanks(kWorld, [&](int rank, Communicator& comm) -> absl::Status {
    ZS_ASSIGN_OR_RETURN(FlatLayout layout, FlatLayout::Create(model, kWorld));
    ZS_ASSIGN_OR_RETURN(BufferPlan plan, internal::PlanBuffers(layout, train));
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<TestServices> services, TestServices::Create(comm));
    internal::ShardBuffers buffers(layout, plan, rank, DType::kFloat32, DType::kFloat32);
    ZS_RETURN_IF_ERROR(buffers.Allocate(services->device()));
    StreamDrain drain(*services);
    internal::CheckpointWriter writer(layout, rank, /*mixed=*/false, DType::kFloat32, buffers,
                                      *services);
    for (int64_t step = 1; step <= 3; ++step) {
      for (int u = 0; u < layout.num_units(); ++u) {
        const ElementRange shard = layout.ShardRange(u, rank);
        float* const tensors[3] = {static_cast<float*>(buffers.ParamsAt(u, shard.begin)),
                                   buffers.AdamMAt(u, shard.begin),
                                   buffers.AdamVAt(u, shard.begin)};
        for (int t = 0; t < 3; ++t) {
          for (int64_t i = shard.begin; i < shard.end; ++i) {
            tensors[t][i - shard.begin] = Value(seed, step, t, u, i);
          }
        }
      }
      Manifest m;
      m.step = step;
      m.applied_steps = step;
      m.world_size = kWorld;
      m.train = train;
      m.model = model;
      m.model_fingerprint = internal::FingerprintModelSpec(model);
      for (int u = 0; u < layout.num_units(); ++u) {
        m.used_numel.push_back(layout.unit(u).used_numel);
        m.shard_numel.push_back(layout.unit(u).shard_numel);
      }
      m.trainer_state = "{}";
      CheckpointOptions options;
      options.keep_last = 2;
      ZS_ASSIGN_OR_RETURN(const int64_t state_bytes, internal::TrainerStateManifestBytes("{}"));
      ZS_RETURN_IF_ERROR(writer.Begin(root, options, m, absl::OkStatus(), state_bytes));
      if (!writer.pending()) return absl::InternalError("Begin left nothing pending");
      // The writer works from its snapshot: the buffers may change at once.
      for (int u = 0; u < layout.num_units(); ++u) {
        *buffers.AdamMAt(u, layout.ShardRange(u, rank).begin) = -1.0f;
      }
      ZS_RETURN_IF_ERROR(writer.Commit(absl::OkStatus()));
      if (writer.pending()) return absl::InternalError("Commit left the checkpoint pending");
    }
    // A rank that reports a failed write (here: an argument only rank 1
    // finds wrong) fails the directory check on every rank.
    const absl::Status local =
        rank == 1 ? absl::InvalidArgumentError("Save: bad argument on rank 1") : absl::OkStatus();
    Manifest m;
    m.step = 4;
    const absl::Status refused = writer.Begin(root, CheckpointOptions(), m, local, 0);
    if (refused.code() != absl::StatusCode::kInvalidArgument ||
        refused.message().find("rank 1") == absl::string_view::npos) {
      return absl::InternalError("rank 1's refusal: " + refused.ToString());
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(run.ok()) << run << "; " << SeedTrace();

  // `latest` names step 3; steps 2 and 3 are kept (keep_last 2), 1 pruned.
  std::string note;
  auto latest = internal::ResolveCheckpointWithNote(root, &note);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, internal::JoinPath(root, internal::StepDirName(3)));
  EXPECT_FALSE(internal::PathExists(internal::JoinPath(root, internal::StepDirName(1))));
  EXPECT_TRUE(internal::IsDirectory(internal::JoinPath(root, internal::StepDirName(2))));
  auto manifest = internal::ReadManifest(*latest);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 3);
  ASSERT_EQ(manifest->files.size(), static_cast<size_t>(kWorld));
  auto layout = FlatLayout::Create(model, kWorld);
  ASSERT_TRUE(layout.ok());
  for (int r = 0; r < kWorld; ++r) {
    auto reader = internal::RankFileReader::Open(*latest, *manifest, r);
    ASSERT_TRUE(reader.ok()) << reader.status();
    for (int u = 0; u < layout->num_units(); ++u) {
      std::vector<float> whole[internal::kTensorsPerUnit];
      ASSERT_TRUE(reader->ReadUnit(u, whole).ok());
      const ElementRange shard = layout->ShardRange(u, r);
      for (int t = 0; t < internal::kTensorsPerUnit; ++t) {
        ASSERT_EQ(whole[t].size(), static_cast<size_t>(shard.size()));
        for (int64_t i = shard.begin; i < shard.end; ++i) {
          ASSERT_EQ(whole[t][i - shard.begin], Value(seed, 3, t, u, i))
              << "rank " << r << " unit " << u << " tensor " << t << " element " << i << "; "
              << SeedTrace();
        }
      }
    }
  }
  EXPECT_TRUE(internal::RemoveTree(tmpl).ok());
}

}  // namespace
}  // namespace zeroshard::testing
