// The grid step model of the MLP demo's --mem-cap choice (PredictMlpGridStep)
// and the machine profile's optional offload section.
#include <cmath>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "tools/machine_profile.h"
#include "tools/mlp_step_model.h"

namespace zeroshard {
namespace {

MachineProfile Profile(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> jitter(1.0, 2.0);
  MachineProfile p;
  p.cores = 2;
  p.calibrated_hidden = 64;
  p.calibrated_micro_batch = 4;
  p.sgemm_flops_per_s = 1e9 * jitter(rng);
  p.gelu_s_per_element = 1e-9 * jitter(rng);
  p.gelu_grad_s_per_element = 2e-9 * jitter(rng);
  p.copy_bytes_per_s = 1e9 * jitter(rng);
  p.optimizer_s_per_param = 1e-9 * jitter(rng);
  CollectiveProfile c;
  c.all_reduce = {10e-6, 1e9 * jitter(rng)};
  c.reduce_scatter = {5e-6, 2e9 * jitter(rng)};
  c.all_gather = {5e-6, 2e9 * jitter(rng)};
  p.collectives["local"][2] = c;
  return p;
}

TEST(MlpGridStepModelTest, OffloadAddsItsCopiesAndSwapTraffic) {
  std::mt19937_64 rng(testing::Seed());
  MachineProfile p = Profile(rng);
  p.offload.host_copy_bytes_per_s = 3e9;
  const MlpWorkload w{64, 4, 32};
  MlpGridRun run;
  run.dp = 2;
  run.stage = 2;
  auto device = PredictMlpGridStep(w, run, "local", p);
  ASSERT_TRUE(device.ok()) << device.status();
  run.optimizer_tier = MemoryTier::kHost;
  auto host = PredictMlpGridStep(w, run, "local", p);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(device->offload_copy, 0.0);
  // Gradients out and params back: 8 bytes per shard param at host_copy.
  const double shard = host->optimizer / p.optimizer_s_per_param;
  EXPECT_NEAR(host->offload_copy, 8.0 * shard / 3e9, 1e-12) << testing::SeedTrace();
  EXPECT_NEAR(host->total - device->total, host->offload_copy, 1e-9) << testing::SeedTrace();
  EXPECT_EQ(host->compute, device->compute);

  run.optimizer_tier = MemoryTier::kNvme;
  auto missing = PredictMlpGridStep(w, run, "local", p);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("zeroshard calibrate --what offload"),
            std::string::npos)
      << missing.status();
  // Slow disks: the swap traffic is longer than the update it overlaps.
  p.offload.nvme_read_bytes_per_s = 1e7;
  p.offload.nvme_write_bytes_per_s = 5e6;
  auto nvme = PredictMlpGridStep(w, run, "local", p);
  ASSERT_TRUE(nvme.ok()) << nvme.status();
  const double state_bytes = 8.0 * shard;  // fp32: m and v
  EXPECT_NEAR(nvme->offload_io, state_bytes / 1e7 + state_bytes / 5e6, 1e-9);
  EXPECT_NEAR(nvme->optimizer_phase, nvme->offload_io + nvme->offload_copy, 1e-9);
  EXPECT_GT(nvme->total, host->total);
}

TEST(MlpGridStepModelTest, PipelineAndTensorSplitsPayTheirBubbleAndAllReduces) {
  std::mt19937_64 rng(testing::Seed());
  const MachineProfile p = Profile(rng);
  const MlpWorkload w{64, 4, 32};
  MlpGridRun pp;
  pp.pp = 2;
  auto piped = PredictMlpGridStep(w, pp, "local", p);
  ASSERT_TRUE(piped.ok()) << piped.status();
  EXPECT_EQ(piped->micro_batches, 2);
  // 1F1B over 2 micro-batches: one micro-batch of fill and drain.
  EXPECT_NEAR(piped->bubble, piped->compute / 2, 1e-12);
  EXPECT_GT(piped->pp_comm, 0);
  EXPECT_EQ(piped->tp_comm, 0);
  MlpGridRun tp;
  tp.tp = 2;
  auto split = PredictMlpGridStep(w, tp, "local", p);
  ASSERT_TRUE(split.ok()) << split.status();
  // Two all-reduces of b x h fp32 per block per micro-batch.
  const double ar = p.collectives.at("local").at(2).all_reduce.Seconds(32.0 * 64 * 4);
  EXPECT_NEAR(split->tp_comm, 2.0 * 4 * 2 * ar, 1e-12);
  EXPECT_EQ(split->bubble, 0);
  MlpGridRun four;
  four.tp = 4;
  EXPECT_EQ(PredictMlpGridStep(w, four, "local", p).status().code(), absl::StatusCode::kNotFound);
  MlpGridRun bad;
  bad.pp = 5;  // more stages than blocks
  EXPECT_EQ(PredictMlpGridStep(w, bad, "local", p).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MachineProfileOffloadTest, TheOffloadSectionRoundTripsAndIsOptional) {
  std::mt19937_64 rng(testing::Seed());
  MachineProfile p = Profile(rng);
  p.machine = "m";
  p.cpu = "c";
  p.date = "d";
  p.blas = "b";
  // Without offload rates: no section, and it parses back without one.
  auto bare = ParseMachineProfile(MachineProfileJson(p), "bare.json");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(MachineProfileJson(p).find("\"offload\""), std::string::npos);
  EXPECT_EQ(bare->offload.nvme_read_bytes_per_s, 0);
  std::uniform_real_distribution<double> gbps(0.01, 50.0);
  p.offload.host_copy_bytes_per_s = gbps(rng) * 1e9;
  p.offload.nvme_read_bytes_per_s = gbps(rng) * 1e9;
  p.offload.nvme_write_bytes_per_s = gbps(rng) * 1e9;
  p.offload.io_backend = "io_uring (queue depth 32), O_DIRECT";
  p.offload.dir = "/scratch/nvme0";
  auto back = ParseMachineProfile(MachineProfileJson(p), "full.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_DOUBLE_EQ(back->offload.host_copy_bytes_per_s, p.offload.host_copy_bytes_per_s);
  EXPECT_DOUBLE_EQ(back->offload.nvme_read_bytes_per_s, p.offload.nvme_read_bytes_per_s);
  EXPECT_DOUBLE_EQ(back->offload.nvme_write_bytes_per_s, p.offload.nvme_write_bytes_per_s);
  EXPECT_EQ(back->offload.io_backend, p.offload.io_backend);
  EXPECT_EQ(back->offload.dir, p.offload.dir);
  // Out of range: named.
  p.offload.nvme_write_bytes_per_s = 2e15;
  const absl::Status bad = ValidateMachineProfile(p);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("offload.nvme_write_gbps"), std::string::npos) << bad;
  std::string text = MachineProfileJson(p);
  auto parsed = ParseMachineProfile(text, "bad.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("bad.json: field 'offload.nvme_write_gbps'"),
            std::string::npos)
      << parsed.status();
}

}  // namespace
}  // namespace zeroshard
