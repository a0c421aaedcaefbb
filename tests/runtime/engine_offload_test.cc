// The optimizer state on the host and NVMe tiers (TrainSpec::offload) trains
// the device tier's model bit for bit: the engine streams the gradients to
// the host, updates there (from swap files on NVMe) and streams the params
// back, in chunks small enough here (1024 elements) that every unit spans
// several and most chunks hold pieces of several units. The offloaded runs
// use a device whose memory the host may not touch (every copy a device
// copy); the baseline runs on the plain CPU device. Each tier's ledger
// equals the plan's buffers of that tier on every rank. A swap file
// removed, truncated or written into in place between steps stops the next
// step, named.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/runtime/opaque_cpu_device.h"
#include "tests/runtime/synthetic_trainer.h"
#include "tests/test_seed.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

namespace fs = std::filesystem;

// A fresh directory under /tmp, removed with its contents at the end.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/zs_offload_XXXXXX";
    const char* made = mkdtemp(pattern);
    path_ = made != nullptr ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TrainSpec WithOffload(TrainSpec train, MemoryTier tier, const std::string& dir,
                      MemoryTier grads = MemoryTier::kDevice,
                      MemoryTier params = MemoryTier::kDevice) {
  train.offload.optimizer = tier;
  train.offload.grads = grads;
  train.offload.params = params;
  train.offload.dir = tier == MemoryTier::kNvme ? dir : "";
  train.offload.chunk_numel = 1024;
  return train;
}

absl::StatusOr<SyntheticRunResult> RunTier(const TrainSpec& train, int world, int steps,
                                           bool opaque, std::atomic<int64_t>* copies = nullptr,
                                           const std::string& load = "",
                                           const std::string& save = "") {
  SyntheticRunSpec run;
  run.world = world;
  run.train = train;
  run.steps = steps;
  run.load_dir = load;
  run.save_dir = save;
  run.comm.timeout = absl::Seconds(60);
  run.make_device = [opaque, copies](int) -> absl::StatusOr<std::unique_ptr<Device>> {
    if (opaque) return std::unique_ptr<Device>(std::make_unique<OpaqueCpuDevice>(copies));
    return CreateCpuDevice();
  };
  return RunSyntheticRanks(run);
}

int FilesIn(const std::string& dir) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    (void)entry;
    ++n;
  }
  return n;
}

TEST(EngineOffloadTest, HostAndNvmeTiersTrainTheDeviceTiersModelBitForBit) {
  TempDir swap;
  ASSERT_FALSE(swap.path().empty());
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed, Precision::kFp16Mixed}) {
    for (int world = 1; world <= 4; ++world) {
      for (int stage = 1; stage <= 3; ++stage) {
        // Gradient accumulation on 1 and 3 ranks, one micro-batch on 2 and 4.
        const int accum = (world % 2 == 1) ? 2 : 1;
        const TrainSpec train = SyntheticTrain(stage, precision, accum);
        const std::string what =
            absl::StrFormat("%s, %d rank(s), stage %d, accum %d, %s", PrecisionName(precision),
                            world, stage, accum, SeedTrace());
        auto device = RunTier(train, world, 3, /*opaque=*/false);
        ASSERT_TRUE(device.ok()) << device.status() << " " << what;
        EXPECT_TRUE(device->ledger_vs_plan.empty())
            << absl::StrJoin(device->ledger_vs_plan, "; ") << " " << what;
        // The optimizer state on each tier, the gradients streamed with the
        // update or copied to the host during the backward.
        // At stage 3 also the param shards on the host.
        struct Tiers {
          MemoryTier optimizer, grads, params;
        };
        std::vector<Tiers> tiers = {{MemoryTier::kHost, MemoryTier::kDevice, MemoryTier::kDevice},
                                    {MemoryTier::kHost, MemoryTier::kHost, MemoryTier::kDevice},
                                    {MemoryTier::kNvme, MemoryTier::kDevice, MemoryTier::kDevice},
                                    {MemoryTier::kNvme, MemoryTier::kHost, MemoryTier::kDevice}};
        if (stage == 3) {
          tiers.push_back({MemoryTier::kHost, MemoryTier::kHost, MemoryTier::kHost});
          tiers.push_back({MemoryTier::kNvme, MemoryTier::kDevice, MemoryTier::kHost});
          tiers.push_back({MemoryTier::kNvme, MemoryTier::kDevice, MemoryTier::kNvme});
          tiers.push_back({MemoryTier::kNvme, MemoryTier::kHost, MemoryTier::kNvme});
        }
        for (const Tiers& t : tiers) {
          const MemoryTier tier = t.optimizer;
          const std::string where =
              absl::StrCat(MemoryTierName(tier), " tier, grads on ", MemoryTierName(t.grads),
                           ", params on ", MemoryTierName(t.params), ": ", what);
          std::atomic<int64_t> copies{0};
          auto offloaded = RunTier(WithOffload(train, tier, swap.path(), t.grads, t.params), world,
                                   3, true, &copies);
          ASSERT_TRUE(offloaded.ok()) << offloaded.status() << " " << where;
          EXPECT_EQ(FirstDifference(*device, *offloaded), "") << where;
          EXPECT_GT(copies.load(), 0) << where;
          EXPECT_TRUE(offloaded->ledger_vs_plan.empty())
              << absl::StrJoin(offloaded->ledger_vs_plan, "; ") << " " << where;
          // The state left the device: the device holds the params and
          // gradients only, the offloaded tier the rest.
          EXPECT_LT(offloaded->model_state_bytes, device->model_state_bytes) << where;
          EXPECT_GT(offloaded->tier_bytes[static_cast<int>(tier)], 0) << where;
          // A normal end leaves no swap file behind.
          EXPECT_EQ(FilesIn(swap.path()), 0) << where;
        }
      }
    }
  }
}

TEST(EngineOffloadTest, Fp16SkippedStepsAreSkippedAlikeOnEveryTier) {
  // The synthetic gradients overflow fp16 at the initial loss scale, so the
  // first steps are skipped until the scale has come down (how many depends
  // on the seed's gradients: a run without injection says); then an inf in
  // one rank's gradient at the step after the first applied one skips that
  // step on every rank. The tiers agree on every bit, the skips included.
  constexpr int kSteps = 10;
  TempDir swap;
  for (int stage = 1; stage <= 3; ++stage) {
    SyntheticRunSpec run;
    run.world = 2;
    run.steps = kSteps;
    run.comm.timeout = absl::Seconds(60);
    run.make_device = [](int) -> absl::StatusOr<std::unique_ptr<Device>> {
      return CreateCpuDevice();
    };
    run.train = SyntheticTrain(stage, Precision::kFp16Mixed, 2);
    auto plain = RunSyntheticRanks(run);
    ASSERT_TRUE(plain.ok()) << plain.status() << " stage " << stage;
    int first_applied = 0;
    while (first_applied < kSteps && plain->steps[first_applied].skipped) ++first_applied;
    ASSERT_GE(first_applied, 1) << "the initial loss scale did not overflow: " << SeedTrace();
    ASSERT_LE(first_applied, kSteps - 3) << "the loss scale came down too late: " << SeedTrace();
    const int64_t inject = first_applied + 1;
    run.hooks.after_grads = [inject](int64_t step, int rank, int unit, UnitView& grads) {
      if (step == inject && rank == 1 && unit == 0) {
        static_cast<uint16_t*>(grads.params[0].data)[3] = 0x7c00;  // fp16 +inf
      }
    };
    std::vector<SyntheticRunResult> results;
    for (MemoryTier tier : {MemoryTier::kDevice, MemoryTier::kHost, MemoryTier::kNvme}) {
      // The gradients' host copy during the backward on the offloaded tiers.
      run.train =
          WithOffload(SyntheticTrain(stage, Precision::kFp16Mixed, 2), tier, swap.path(),
                      tier == MemoryTier::kDevice ? MemoryTier::kDevice : MemoryTier::kHost);
      auto r = RunSyntheticRanks(run);
      ASSERT_TRUE(r.ok()) << r.status() << " stage " << stage << ", " << MemoryTierName(tier);
      ASSERT_EQ(r->steps.size(), static_cast<size_t>(kSteps));
      int applied = 0;
      for (const StepResult& s : r->steps) applied += s.skipped ? 0 : 1;
      EXPECT_TRUE(r->steps[0].skipped) << MemoryTierName(tier);
      EXPECT_FALSE(r->steps[first_applied].skipped) << MemoryTierName(tier);
      EXPECT_TRUE(r->steps[inject].skipped) << MemoryTierName(tier);
      EXPECT_GE(applied, 2) << MemoryTierName(tier);
      results.push_back(*std::move(r));
    }
    EXPECT_EQ(FirstDifference(results[0], results[1]), "") << "host tier, stage " << stage;
    EXPECT_EQ(FirstDifference(results[0], results[2]), "") << "nvme tier, stage " << stage;
  }
}

TEST(EngineOffloadTest, CheckpointsMoveBetweenTiersBitForBit) {
  // Saved on one tier after 3 steps, loaded on another and run 3 more: the
  // same bits as 6 uninterrupted steps on the device tier.
  TempDir swap, ckpt;
  const std::vector<MemoryTier> tiers = {MemoryTier::kDevice, MemoryTier::kHost, MemoryTier::kNvme};
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    const TrainSpec base = SyntheticTrain(3, precision, 2);
    auto whole = RunTier(base, 2, 6, false);
    ASSERT_TRUE(whole.ok()) << whole.status();
    for (MemoryTier from : tiers) {
      for (MemoryTier to : tiers) {
        if (from == to && from == MemoryTier::kDevice) continue;
        const std::string what =
            absl::StrFormat("%s: saved on %s, loaded on %s", PrecisionName(precision),
                            MemoryTierName(from), MemoryTierName(to));
        const std::string dir = absl::StrCat(ckpt.path(), "/", MemoryTierName(from), "-",
                                             MemoryTierName(to), PrecisionName(precision));
        auto first = RunTier(WithOffload(base, from, swap.path()), 2, 3, true, nullptr, "", dir);
        ASSERT_TRUE(first.ok()) << first.status() << " " << what;
        auto second = RunTier(WithOffload(base, to, swap.path()), 2, 3, true, nullptr, dir);
        ASSERT_TRUE(second.ok()) << second.status() << " " << what;
        ASSERT_EQ(second->params.size(), whole->params.size());
        // The last 3 steps and the final weights.
        SyntheticRunResult tail = *whole;
        tail.steps.erase(tail.steps.begin(), tail.steps.begin() + 3);
        EXPECT_EQ(FirstDifference(tail, *second), "") << what;
      }
    }
    // The param shards on the host tier and on NVMe too, both ways.
    for (MemoryTier params_tier : {MemoryTier::kHost, MemoryTier::kNvme}) {
      for (bool params_first : {true, false}) {
        const std::string what = absl::StrFormat(
            "%s: params on the %s tier %s", PrecisionName(precision), MemoryTierName(params_tier),
            params_first ? "saved, loaded on the device tier" : "loaded from the device tier");
        const TrainSpec off =
            WithOffload(base, MemoryTier::kNvme, swap.path(), MemoryTier::kHost, params_tier);
        const std::string dir =
            absl::StrCat(ckpt.path(), "/params-", MemoryTierName(params_tier),
                         params_first ? "-a-" : "-b-", PrecisionName(precision));
        auto first = RunTier(params_first ? off : base, 2, 3, true, nullptr, "", dir);
        ASSERT_TRUE(first.ok()) << first.status() << " " << what;
        auto second = RunTier(params_first ? base : off, 2, 3, true, nullptr, dir);
        ASSERT_TRUE(second.ok()) << second.status() << " " << what;
        SyntheticRunResult tail = *whole;
        tail.steps.erase(tail.steps.begin(), tail.steps.begin() + 3);
        EXPECT_EQ(FirstDifference(tail, *second), "") << what;
      }
    }
  }
}

TEST(EngineOffloadTest, CombinationsTheEngineCannotRunAreRefusedNamingTheField) {
  struct Case {
    const char* what;
    std::function<void(TrainSpec&)> set;
    const char* field;
  };
  const Case cases[] = {
      {"grads host, optimizer on the device",
       [](TrainSpec& t) { t.offload.grads = MemoryTier::kHost; }, "offload.grads"},
      {"grads nvme",
       [](TrainSpec& t) {
         t.offload.optimizer = MemoryTier::kHost;
         t.offload.grads = MemoryTier::kNvme;
       },
       "offload.grads"},
      {"params host at stage 2",
       [](TrainSpec& t) {
         t.zero_stage = 2;
         t.offload.optimizer = MemoryTier::kHost;
         t.offload.params = MemoryTier::kHost;
       },
       "offload.params"},
      {"params nvme, optimizer on the host",
       [](TrainSpec& t) {
         t.offload.optimizer = MemoryTier::kHost;
         t.offload.params = MemoryTier::kNvme;
       },
       "offload.params"},
      {"params nvme with persistent units",
       [](TrainSpec& t) {
         t.offload.optimizer = MemoryTier::kNvme;
         t.offload.params = MemoryTier::kNvme;
         t.persistent_unit_numel = 64;
       },
       "persistent_unit_numel"},
      {"chunk not a multiple of 1024",
       [](TrainSpec& t) {
         t.offload.optimizer = MemoryTier::kHost;
         t.offload.chunk_numel = 1536;
       },
       "offload.chunk_numel"},
  };
  for (const Case& c : cases) {
    TrainSpec train = SyntheticTrain(3, Precision::kBf16Mixed);
    c.set(train);
    const absl::Status status = train.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << status;
    EXPECT_NE(status.message().find(c.field), std::string::npos) << c.what << ": " << status;
  }
  // NVMe without a directory: at Engine::Create, naming the field.
  TrainSpec train = SyntheticTrain(1, Precision::kBf16Mixed);
  train.offload.optimizer = MemoryTier::kNvme;
  const ModelSpec spec = SyntheticSpec();
  std::unique_ptr<Device> device = CreateCpuDevice();
  const absl::Status created = RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    return Engine::Create(spec, train, *device, comm).status();
  });
  EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << created;
  EXPECT_NE(created.message().find("offload.dir"), std::string::npos) << created;
}

TEST(EngineOffloadTest, AFullDiskIsRefusedAtCreateNamingTheBytes) {
  // A 16 KiB file system cannot hold the swap files of this model's state.
  TempDir mountpoint;
  ASSERT_EQ(mount("tmpfs", mountpoint.path().c_str(), "tmpfs", 0, "size=16k"), 0)
      << "mount -t tmpfs on " << mountpoint.path() << " failed (" << std::strerror(errno)
      << "): this test needs root to make a small file system; run it as root (CI does)";
  const ModelSpec spec = SyntheticSpec();
  TrainSpec train =
      WithOffload(SyntheticTrain(0, Precision::kBf16Mixed), MemoryTier::kNvme, mountpoint.path());
  absl::StatusOr<BufferPlan> plan = PlanEngineBuffers(spec, train, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->total_bytes(MemoryTier::kNvme), 16 * 1024);
  std::unique_ptr<Device> device = CreateCpuDevice();
  absl::Status created = RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    return Engine::Create(spec, train, *device, comm).status();
  });
  umount(mountpoint.path().c_str());
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.code(), absl::StatusCode::kResourceExhausted) << created;
  EXPECT_NE(created.message().find(mountpoint.path()), std::string::npos) << created;
  EXPECT_NE(created.message().find("bytes"), std::string::npos) << created;
}

// Another program writes 16 floats of 1e30 into `path` at `offset`, in
// place, through its own descriptor.
void WriteHugeFloatsInPlace(const std::string& path, int64_t offset) {
  const std::vector<float> huge(16, 1e30f);
  const int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  ASSERT_EQ(pwrite(fd, huge.data(), huge.size() * sizeof(float), offset),
            static_cast<ssize_t>(huge.size() * sizeof(float)))
      << path << ": " << std::strerror(errno);
  ASSERT_EQ(close(fd), 0);
}

// Damages a swap file of rank 0 after step 2: removes or truncates it, or
// writes into it in place (the swap data's checksums, issue 34) at the
// header page, the first chunk's first page or the last chunk's last page.
// Step 3 must fail naming it; rank 0 never finishes step 3.
void ExpectDamagedSwapFileFailsTheStep(const std::string& how) {
  TempDir swap;
  SyntheticRunSpec run;
  run.world = 2;
  run.steps = 4;
  run.comm.timeout = absl::Seconds(20);
  run.train = WithOffload(SyntheticTrain(2, Precision::kBf16Mixed), MemoryTier::kNvme, swap.path());
  run.make_device = [](int) -> absl::StatusOr<std::unique_ptr<Device>> {
    return CreateCpuDevice();
  };
  std::string damaged;
  int64_t damaged_page = -1;  // the file offset of the page written into
  int64_t last_step_of_rank0 = 0;
  run.after_step = [&](int64_t step, int rank, Engine&) {
    if (rank == 0) last_step_of_rank0 = step;
    if (step != 2 || rank != 0) return;
    for (const auto& entry : fs::directory_iterator(swap.path())) {
      const std::string name = entry.path().filename().string();
      if (name.find("rank0") == std::string::npos || name.find("adam_v") == std::string::npos) {
        continue;
      }
      damaged = entry.path().string();
      if (how == "truncate") {
        ASSERT_EQ(truncate(damaged.c_str(), 4096), 0);
      } else if (how == "remove") {
        ASSERT_EQ(unlink(damaged.c_str()), 0);
      } else {
        const int64_t size = static_cast<int64_t>(fs::file_size(entry.path()));
        ASSERT_GT(size, 2 * 4096) << damaged;
        // In the header, past its text: only the checksum can see it.
        damaged_page = how == "header" ? 0 : how == "first chunk" ? 4096 : size - 4096;
        WriteHugeFloatsInPlace(damaged, damaged_page + (how == "header" ? 1024 : 0));
      }
    }
  };
  auto r = RunSyntheticRanks(run);
  ASSERT_FALSE(damaged.empty()) << "no swap file of rank 0's adam_v in " << swap.path();
  ASSERT_FALSE(r.ok()) << how << ": the run went on after its swap file was damaged";
  EXPECT_NE(r.status().message().find(damaged), std::string::npos) << r.status();
  EXPECT_EQ(last_step_of_rank0, 2) << how << ": the damage must stop the next step";
  if (damaged_page < 0) return;
  std::printf("%s damaged in place: %s\n", how.c_str(), r.status().ToString().c_str());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("(tensor adam_v)"), std::string::npos) << r.status();
  const std::string at = damaged_page == 0
                             ? std::string("header page (offset 0")
                             : absl::StrCat("page at file offset ", damaged_page, " ");
  EXPECT_NE(r.status().message().find(at), std::string::npos) << at << ": " << r.status();
}

TEST(EngineOffloadTest, ATruncatedSwapFileFailsTheStepNamingIt) {
  ExpectDamagedSwapFileFailsTheStep("truncate");
}

TEST(EngineOffloadTest, ARemovedSwapFileFailsTheStepNamingIt) {
  ExpectDamagedSwapFileFailsTheStep("remove");
}

TEST(EngineOffloadTest, ASwapFileHeaderDamagedInPlaceFailsTheStepNamingIt) {
  ExpectDamagedSwapFileFailsTheStep("header");
}

TEST(EngineOffloadTest, ASwapFileFirstChunkDamagedInPlaceFailsTheStepNamingIt) {
  ExpectDamagedSwapFileFailsTheStep("first chunk");
}

TEST(EngineOffloadTest, ASwapFileLastChunkDamagedInPlaceFailsTheStepNamingIt) {
  ExpectDamagedSwapFileFailsTheStep("last chunk");
}

TEST(EngineOffloadTest, ARunKilledDuringAnNvmeStepResumesFromItsCheckpointBitForBit) {
  // A child trains on the NVMe tier, checkpointing after each step, and is
  // killed (SIGKILL) in the middle of a step: its swap files stay behind,
  // stale. A new run in the same swap directory replaces them, loads the
  // last checkpoint and runs to the end: the same bits as a run that was
  // never killed.
  TempDir swap, ckpt;
  const int kSteps = 6;
  TrainSpec train =
      WithOffload(SyntheticTrain(3, Precision::kBf16Mixed, 2), MemoryTier::kNvme, swap.path());
  auto whole = RunTier(train, 1, kSteps, false);
  ASSERT_TRUE(whole.ok()) << whole.status();

  const std::string ckpt_dir = ckpt.path() + "/run";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Steps 1-3 with a checkpoint after each; in step 4 a thread kills the
    // process 200 us after the last gradient is written: during the update
    // on a quiet machine, a little later on a loaded one. Either way the
    // swap files stay behind and the last checkpoint is step 3's.
    SyntheticRunSpec run;
    run.world = 1;
    run.steps = 4;
    run.train = train;
    run.comm.timeout = absl::Seconds(60);
    run.make_device = [](int) -> absl::StatusOr<std::unique_ptr<Device>> {
      return CreateCpuDevice();
    };
    run.after_step = [&](int64_t step, int, Engine& engine) {
      // On a loaded machine the killer thread may not run before step 4
      // ends: wait for it here, so that the run never reaches its normal
      // end (which would remove the swap files).
      if (step == 4) {
        for (;;) pause();
      }
      if (step > 3) return;  // the checkpoint to resume from is step 3's
      if (!engine.Save(ckpt_dir, "{}", CheckpointOptions{}).ok()) _exit(3);
      if (!engine.WaitForCheckpoint().ok()) _exit(4);
    };
    run.hooks.after_grads = [](int64_t step, int, int unit, UnitView&) {
      if (step == 3 && unit == 0) {
        // The last unit of the backward: Step() follows. Kill the process
        // from another thread while the update is in flight.
        std::thread([] {
          usleep(200);
          kill(getpid(), SIGKILL);
        }).detach();
      }
    };
    (void)RunSyntheticRanks(run);
    // Not killed yet: die now, still mid-run (no normal end).
    kill(getpid(), SIGKILL);
    _exit(5);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "the child ended with status " << wstatus << " instead of being killed";
  // The killed run's swap files are still there.
  ASSERT_GT(FilesIn(swap.path()), 0);

  auto resumed = RunTier(train, 1, kSteps - 3, false, nullptr, ckpt_dir);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  SyntheticRunResult tail = *whole;
  tail.steps.erase(tail.steps.begin(), tail.steps.begin() + 3);
  EXPECT_EQ(FirstDifference(tail, *resumed), "");
  EXPECT_EQ(FilesIn(swap.path()), 0) << "the resumed run's normal end left swap files";
}

}  // namespace
}  // namespace zeroshard::testing
