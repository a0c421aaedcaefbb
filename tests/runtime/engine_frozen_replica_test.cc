// Engine::SetFrozenParam: a param declared frozen takes new values between
// steps (a replica of a param another engine trains, as the GPT grid's LM
// head on the last pipeline stage), at every ZeRO stage, in fp32 and bf16,
// and the next Gather shows them on every rank (stage 3 included, where the
// gather pool keeps a frozen unit's copy across steps); the misuses are
// refused by name.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"
#include "zeroshard/engine.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {
namespace {

// Unit "body": a trainable weight; unit "replica": one frozen param (odd
// sizes, so that the shards split the params unevenly).
ModelSpec ReplicaSpec() {
  ModelSpec spec;
  UnitSpec body;
  body.name = "body";
  body.params.push_back({"w", {37, 5}});
  UnitSpec replica;
  replica.name = "replica";
  ParamSpec r{"r", {53, 3}};
  r.trainable = false;
  replica.params.push_back(r);
  spec.units = {body, replica};
  return spec;
}

// Random values (normal, fresh per seed and key), rounded to bf16 when
// `bf16`, so that the param dtype keeps them exactly.
std::vector<float> Values(uint64_t seed, uint64_t key, int64_t n, bool bf16) {
  std::mt19937_64 gen(seed ^ (key * 0x9E3779B97F4A7C15ull));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = dist(gen);
    if (bf16) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      bits &= 0xFFFF0000u;
      std::memcpy(&x, &bits, 4);
    }
  }
  return v;
}

// The gathered view of a param as fp32.
std::vector<float> ViewAsFp32(const UnitView& view, int p) {
  const auto& t = view.params[p];
  std::vector<float> out(static_cast<size_t>(t.numel));
  if (t.dtype == DType::kFloat32) {
    std::memcpy(out.data(), t.data, out.size() * 4);
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(t.data);
    for (size_t i = 0; i < out.size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
      std::memcpy(&out[i], &bits, 4);
    }
  }
  return out;
}

std::string FirstDifference(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return absl::StrFormat("%d values, want %d", got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      return absl::StrFormat("element %d is %.9g, want %.9g", i, got[i], want[i]);
    }
  }
  return "";
}

// Steps 1..3 on `world` ranks: before each step the replica holds the
// values set after the previous one (the initial ones before step 1); the
// forward's view, and GetParam at the end, must show exactly those.
absl::Status RunReplica(int world, int stage, Precision precision, uint64_t seed) {
  const ModelSpec spec = ReplicaSpec();
  const bool bf16 = precision != Precision::kFp32;
  TrainSpec train;
  train.zero_stage = stage;
  train.precision = precision;
  train.optimizer.lr = 1e-2;
  train.max_gathered_units = 2;
  train.prefetch_units = 1;
  return RunLocalRanks(world, [&](int rank, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Create(spec, train, *device, comm));
    ZS_RETURN_IF_ERROR(e->SetParam(0, 0, Values(seed, 1, 37 * 5, bf16)));
    std::vector<float> want = Values(seed, 2, 53 * 3, bf16);
    ZS_RETURN_IF_ERROR(e->SetParam(1, 0, want));
    ZS_RETURN_IF_ERROR(e->Start());
    for (int step = 1; step <= 3; ++step) {
      ZS_ASSIGN_OR_RETURN(UnitView body, e->Gather(0));
      (void)body;
      ZS_ASSIGN_OR_RETURN(UnitView replica, e->Gather(1));
      if (std::string d = FirstDifference(ViewAsFp32(replica, 0), want); !d.empty()) {
        return absl::InternalError(
            absl::StrFormat("rank %d, step %d: the replica's view: %s", rank, step, d));
      }
      ZS_RETURN_IF_ERROR(e->Release(1));
      ZS_RETURN_IF_ERROR(e->Release(0));
      ZS_ASSIGN_OR_RETURN(UnitView body_again, e->Gather(0));
      (void)body_again;
      ZS_ASSIGN_OR_RETURN(UnitView grads, e->GradView(0));
      const std::vector<float> g = Values(seed, 100 + step * world + rank, 37 * 5, false);
      if (grads.params[0].dtype == DType::kFloat32) {
        std::memcpy(grads.params[0].data, g.data(), g.size() * 4);
      } else {
        uint16_t* h = static_cast<uint16_t*>(grads.params[0].data);
        for (size_t i = 0; i < g.size(); ++i) {
          uint32_t bits;
          std::memcpy(&bits, &g[i], 4);
          h[i] = static_cast<uint16_t>(bits >> 16);
        }
      }
      // Mid-step: refused.
      const absl::Status mid = e->SetFrozenParam(1, 0, want);
      if (mid.code() != absl::StatusCode::kFailedPrecondition) {
        return absl::InternalError(absl::StrFormat("mid-step SetFrozenParam: %s", mid.ToString()));
      }
      ZS_RETURN_IF_ERROR(e->ReduceGrads(0));
      ZS_RETURN_IF_ERROR(e->Release(0));
      ZS_RETURN_IF_ERROR(e->Step().status());
      want = Values(seed, 10 + step, 53 * 3, bf16);
      ZS_RETURN_IF_ERROR(e->SetFrozenParam(1, 0, want));
    }
    ZS_ASSIGN_OR_RETURN(std::vector<float> got, e->GetParam(1, 0));
    if (std::string d = FirstDifference(got, want); !d.empty()) {
      return absl::InternalError(absl::StrFormat("rank %d, GetParam at the end: %s", rank, d));
    }
    return absl::OkStatus();
  });
}

TEST(FrozenReplicaTest, NewValuesReachTheNextGatherAtEveryStage) {
  const uint64_t seed = Seed();
  for (Precision precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    for (int world : {1, 2, 3}) {
      for (int stage = 0; stage <= 3; ++stage) {
        const absl::Status s = RunReplica(world, stage, precision, seed);
        EXPECT_TRUE(s.ok()) << "world " << world << ", stage " << stage << ", "
                            << PrecisionName(precision) << ": " << s << "; " << SeedTrace();
      }
    }
  }
}

TEST(FrozenReplicaTest, MisusesAreRefusedByName) {
  const ModelSpec spec = ReplicaSpec();
  TrainSpec train;
  train.zero_stage = 3;
  const absl::Status status = RunLocalRanks(1, [&](int, Communicator& comm) -> absl::Status {
    std::unique_ptr<Device> device = CreateCpuDevice();
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Create(spec, train, *device, comm));
    const std::vector<float> ok(53 * 3, 0.5f);
    EXPECT_EQ(e->SetFrozenParam(1, 0, ok).code(), absl::StatusCode::kFailedPrecondition)
        << "before Start";
    ZS_RETURN_IF_ERROR(e->SetParam(0, 0, std::vector<float>(37 * 5, 0.25f)));
    ZS_RETURN_IF_ERROR(e->SetParam(1, 0, ok));
    ZS_RETURN_IF_ERROR(e->Start());
    const absl::Status trainable = e->SetFrozenParam(0, 0, std::vector<float>(37 * 5, 1.0f));
    EXPECT_EQ(trainable.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(trainable.message().find("body.w"), std::string::npos) << trainable;
    EXPECT_NE(trainable.message().find("declared trainable"), std::string::npos) << trainable;
    const absl::Status size = e->SetFrozenParam(1, 0, std::vector<float>(5, 1.0f));
    EXPECT_EQ(size.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(size.message().find("replica.r"), std::string::npos) << size;
    std::vector<float> nan = ok;
    nan[77] = std::nanf("");
    const absl::Status bad = e->SetFrozenParam(1, 0, nan);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.message().find("element 77"), std::string::npos) << bad;
    EXPECT_EQ(e->SetFrozenParam(1, 1, ok).code(), absl::StatusCode::kOutOfRange);
    ZS_ASSIGN_OR_RETURN(UnitView held, e->Gather(1));
    (void)held;
    const absl::Status gathered = e->SetFrozenParam(1, 0, ok);
    EXPECT_EQ(gathered.code(), absl::StatusCode::kFailedPrecondition) << gathered;
    EXPECT_NE(gathered.message().find("replica"), std::string::npos) << gathered;
    ZS_RETURN_IF_ERROR(e->Release(1));
    // The refusals changed nothing.
    ZS_ASSIGN_OR_RETURN(std::vector<float> got, e->GetParam(1, 0));
    EXPECT_EQ(FirstDifference(got, ok), "");
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace zeroshard::testing
