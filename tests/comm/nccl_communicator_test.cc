// The nccl backend on GPUs: every collective and dtype, in place and not,
// bitwise against the local backend on the same random inputs; tags and
// mismatched collectives; a rank that never arrives becomes DeadlineExceeded
// within the timeout; host memory is refused. World 1 on one GPU, and world =
// the number of GPUs when there are several (NCCL needs one GPU per rank).
// Labelled `gpu`; without a device every test skips visibly.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/fake_cuda_device.h"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"
#include "zeroshard/dtype.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

using ::testing::HasSubstr;
using testing_comm::FakeCudaDevice;

int GpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

#define ZS_SKIP_WITHOUT_GPUS(n)                                                               \
  do {                                                                                        \
    if (GpuCount() < (n)) {                                                                   \
      std::printf("[  SKIPPED ] needs %d CUDA device(s), found %d: nccl test not run\n", (n), \
                  GpuCount());                                                                \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << GpuCount();             \
    }                                                                                         \
  } while (0)

// The communicator only reads a device's kind and name ("cuda:N"); the test
// allocates with cudaMalloc itself, so it does not depend on CreateCudaDevice.
struct Gpus {
  explicit Gpus(int n) {
    for (int i = 0; i < n; ++i) {
      owned.push_back(std::make_unique<FakeCudaDevice>(absl::StrFormat("cuda:%d", i)));
      devices.push_back(owned.back().get());
    }
  }
  std::vector<std::unique_ptr<FakeCudaDevice>> owned;
  std::vector<Device*> devices;
};

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

struct Case {
  Kind kind;
  bool in_place;
  DType dtype;
  int64_t count;  // the API's count: AllReduce/Broadcast count, RS recv, AG send
  int root = 0;
};

std::string Describe(const Case& c) {
  static const char* const kNames[] = {"AllReduce", "ReduceScatter", "AllGather", "Broadcast"};
  return absl::StrFormat("%s%s %s count %d root %d", kNames[static_cast<int>(c.kind)],
                         c.in_place ? " (in place)" : "", DTypeName(c.dtype), c.count, c.root);
}

int64_t InputElements(const Case& c, int world) {
  return c.kind == Kind::kReduceScatter ? c.count * world : c.count;
}
int64_t OutputElements(const Case& c, int world) {
  return c.kind == Kind::kAllGather ? c.count * world : c.count;
}

// Finite values over many binades, so the sums round, and never so large
// that a sum of up to 16 of them overflows the dtype (an inf - inf NaN's
// payload is not part of the contract).
std::vector<uint8_t> RandomInput(DType dtype, int64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes(n * DTypeSize(dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 10);
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::ldexp(normal(rng), exponent(rng));
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(&bytes[i * 4], &x, 4);
        break;
      case DType::kBFloat16: {
        const uint16_t h = Fp32ToBf16(x);
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      case DType::kFloat16: {
        const uint16_t h = Fp32ToFp16(x);
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      case DType::kFloat64: {
        const double d = static_cast<double>(x) * (1.0 + 1e-9 * normal(rng));
        std::memcpy(&bytes[i * 8], &d, 8);
        break;
      }
      case DType::kInt64: {
        const int64_t v = static_cast<int64_t>(rng());  // full range: sums wrap
        std::memcpy(&bytes[i * 8], &v, 8);
        break;
      }
      case DType::kUInt8:
        bytes[i] = static_cast<uint8_t>(rng());
        break;
    }
  }
  return bytes;
}

// Where a rank's data lives: host vectors (local backend) or cudaMalloc
// (nccl backend).
struct Memory {
  std::function<absl::StatusOr<char*>(size_t)> alloc;
  std::function<void(char*)> free;
  std::function<absl::Status(char*, const void*, size_t)> to_buffer;
  std::function<absl::Status(void*, const char*, size_t)> to_host;
};

Memory HostMemory() {
  return Memory{[](size_t n) -> absl::StatusOr<char*> { return new char[n + 1]; },
                [](char* p) { delete[] p; },
                [](char* dst, const void* src, size_t n) {
                  std::memcpy(dst, src, n);
                  return absl::OkStatus();
                },
                [](void* dst, const char* src, size_t n) {
                  std::memcpy(dst, src, n);
                  return absl::OkStatus();
                }};
}

absl::Status CudaStatus(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s", call, cudaGetErrorString(rc)));
}

Memory GpuMemory() {
  return Memory{[](size_t n) -> absl::StatusOr<char*> {
                  void* p = nullptr;
                  const cudaError_t rc = cudaMalloc(&p, n + 1);
                  if (rc != cudaSuccess) return CudaStatus(rc, "cudaMalloc");
                  return static_cast<char*>(p);
                },
                [](char* p) { cudaFree(p); },
                [](char* dst, const void* src, size_t n) {
                  return CudaStatus(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "cudaMemcpy");
                },
                [](void* dst, const char* src, size_t n) {
                  return CudaStatus(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
                }};
}

// One rank's part of case `c`: inputs[r] is rank r's input; the result is
// stored into (*results)[rank].
absl::Status RunRank(Communicator& comm, const Memory& memory, const Case& c,
                     const std::vector<std::vector<uint8_t>>& inputs,
                     std::vector<std::vector<uint8_t>>* results) {
  const int world = comm.size();
  const int rank = comm.rank();
  const size_t element = DTypeSize(c.dtype);
  const size_t in_bytes = InputElements(c, world) * element;
  const size_t out_bytes = OutputElements(c, world) * element;
  const size_t block = c.count * element;
  absl::StatusOr<char*> in = memory.alloc(in_bytes);
  absl::StatusOr<char*> out = memory.alloc(out_bytes);
  if (!in.ok()) return in.status();
  if (!out.ok()) return out.status();
  absl::Status status = memory.to_buffer(*in, inputs[rank].data(), in_bytes);
  if (status.ok() && c.kind == Kind::kAllGather && c.in_place) {
    status = memory.to_buffer(*out + rank * block, inputs[rank].data(), block);
  }
  const char* result = *out;
  if (status.ok()) {
    switch (c.kind) {
      case Kind::kAllReduce:
        status = comm.AllReduce(*in, c.in_place ? *in : *out, c.count, c.dtype).Wait();
        if (c.in_place) result = *in;
        break;
      case Kind::kReduceScatter: {
        char* recv = c.in_place ? *in + rank * block : *out;
        status = comm.ReduceScatter(*in, recv, c.count, c.dtype).Wait();
        result = recv;
        break;
      }
      case Kind::kAllGather:
        status =
            comm.AllGather(c.in_place ? *out + rank * block : *in, *out, c.count, c.dtype).Wait();
        break;
      case Kind::kBroadcast:
        status = comm.Broadcast(*in, c.count, c.dtype, c.root).Wait();
        result = *in;
        break;
    }
  }
  (*results)[rank].resize(out_bytes);
  if (status.ok()) status = memory.to_host((*results)[rank].data(), result, out_bytes);
  memory.free(*in);
  memory.free(*out);
  return status;
}

// Every case of `cases` issued before any is waited for, each in buffers of
// its own: the nccl backend runs the small ones in batches (one descriptor
// exchange and two NCCL groups for up to 16), and the results must be those
// of one collective at a time. (*results)[k][rank] gets case k's result.
absl::Status RunRankIssuedTogether(Communicator& comm, const Memory& memory,
                                   const std::vector<Case>& cases,
                                   const std::vector<std::vector<std::vector<uint8_t>>>& inputs,
                                   std::vector<std::vector<std::vector<uint8_t>>>* results) {
  const int world = comm.size();
  const int rank = comm.rank();
  struct Issued {
    char* in = nullptr;
    char* out = nullptr;
    const char* result = nullptr;
    size_t out_bytes = 0;
    CommHandle handle;
  };
  std::vector<Issued> issued(cases.size());
  absl::Status status;
  for (size_t k = 0; k < cases.size() && status.ok(); ++k) {
    const Case& c = cases[k];
    Issued& x = issued[k];
    const size_t element = DTypeSize(c.dtype);
    const size_t in_bytes = InputElements(c, world) * element;
    x.out_bytes = OutputElements(c, world) * element;
    const size_t block = c.count * element;
    absl::StatusOr<char*> in = memory.alloc(in_bytes);
    absl::StatusOr<char*> out = memory.alloc(x.out_bytes);
    if (!in.ok() || !out.ok()) return !in.ok() ? in.status() : out.status();
    x.in = *in;
    x.out = *out;
    status = memory.to_buffer(x.in, inputs[k][rank].data(), in_bytes);
    if (status.ok() && c.kind == Kind::kAllGather && c.in_place) {
      status = memory.to_buffer(x.out + rank * block, inputs[k][rank].data(), block);
    }
    if (!status.ok()) break;
    x.result = x.out;
    switch (c.kind) {
      case Kind::kAllReduce:
        x.handle = comm.AllReduce(x.in, c.in_place ? x.in : x.out, c.count, c.dtype);
        if (c.in_place) x.result = x.in;
        break;
      case Kind::kReduceScatter: {
        char* recv = c.in_place ? x.in + rank * block : x.out;
        x.handle = comm.ReduceScatter(x.in, recv, c.count, c.dtype);
        x.result = recv;
        break;
      }
      case Kind::kAllGather:
        x.handle =
            comm.AllGather(c.in_place ? x.out + rank * block : x.in, x.out, c.count, c.dtype);
        break;
      case Kind::kBroadcast:
        x.handle = comm.Broadcast(x.in, c.count, c.dtype, c.root);
        x.result = x.in;
        break;
    }
  }
  for (size_t k = 0; k < cases.size(); ++k) {
    Issued& x = issued[k];
    const absl::Status waited = x.handle.Wait();
    if (status.ok()) status = waited;
    (*results)[k][rank].resize(x.out_bytes);
    if (status.ok() && x.result != nullptr) {
      status = memory.to_host((*results)[k][rank].data(), x.result, x.out_bytes);
    }
    if (x.in != nullptr) memory.free(x.in);
    if (x.out != nullptr) memory.free(x.out);
  }
  return status;
}

// Fresh random inputs for every case and rank, and the local backend's
// results of running the cases one at a time on host memory: (*x)[k][r] is
// case k's data of rank r. `actual` is sized like `expected`.
absl::Status LocalReference(int world, const std::vector<Case>& cases, std::mt19937_64& rng,
                            std::vector<std::vector<std::vector<uint8_t>>>* inputs,
                            std::vector<std::vector<std::vector<uint8_t>>>* expected,
                            std::vector<std::vector<std::vector<uint8_t>>>* actual) {
  const size_t n = cases.size();
  inputs->assign(n, std::vector<std::vector<uint8_t>>(world));
  expected->assign(n, std::vector<std::vector<uint8_t>>(world));
  actual->assign(n, std::vector<std::vector<uint8_t>>(world));
  for (size_t k = 0; k < n; ++k) {
    for (auto& input : (*inputs)[k]) {
      input = RandomInput(cases[k].dtype, InputElements(cases[k], world), rng);
    }
  }
  const Memory host = HostMemory();
  return RunLocalRanks(world, [&](int, Communicator& comm) -> absl::Status {
    for (size_t k = 0; k < n; ++k) {
      ZS_RETURN_IF_ERROR(RunRank(comm, host, cases[k], (*inputs)[k], &(*expected)[k]));
    }
    return absl::OkStatus();
  });
}

// Runs every case on the local backend and on nccl with `world` GPUs and
// compares the results bitwise. One nccl communicator per world serves every
// case in turn (an NCCL init costs a fraction of a second, and reusing one
// also exercises its staging buffers growing and shrinking).
void CompareWithLocal(int world, const std::vector<Case>& cases) {
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  std::mt19937_64 rng(::zeroshard::testing::Seed() + world);
  Gpus gpus(world);
  const size_t n = cases.size();
  std::vector<std::vector<std::vector<uint8_t>>> inputs, expected, actual;
  ASSERT_TRUE(LocalReference(world, cases, rng, &inputs, &expected, &actual).ok());
  const Memory gpu = GpuMemory();
  const absl::Status status =
      RunNcclLocalRanks(gpus.devices, [&](int, Communicator& comm) -> absl::Status {
        EXPECT_EQ(comm.backend(), "nccl");
        for (size_t k = 0; k < n; ++k) {
          const absl::Status one = RunRank(comm, gpu, cases[k], inputs[k], &actual[k]);
          if (!one.ok()) {
            return absl::Status(one.code(), absl::StrCat(Describe(cases[k]), ": ", one.message()));
          }
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  for (size_t k = 0; k < n; ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE(absl::StrFormat("%s, world %d", Describe(c), world));
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(actual[k][r].size(), expected[k][r].size());
      const size_t element = DTypeSize(c.dtype);
      int bad = 0;
      for (size_t i = 0; i < actual[k][r].size() / element; ++i) {
        if (std::memcmp(&actual[k][r][i * element], &expected[k][r][i * element], element) != 0 &&
            ++bad <= 3) {
          ADD_FAILURE() << "rank " << r << " element " << i << " differs from the local backend";
        }
      }
      EXPECT_EQ(bad, 0) << "rank " << r;
    }
  }
}

std::vector<Case> AllCases(int world) {
  std::vector<Case> cases;
  const DType sums[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64,
                        DType::kInt64};
  // Odd counts (scalar kernel path, all-reduce padding), multiples of the
  // world and of 8 (vector path), and one large enough for many blocks.
  const int64_t counts[] = {1, 7, 8 * world, 1000, 4099, (int64_t{1} << 18) + 3};
  for (DType dtype : sums) {
    for (int64_t count : counts) {
      for (bool in_place : {false, true}) {
        cases.push_back({Kind::kAllReduce, in_place, dtype, count});
        cases.push_back({Kind::kReduceScatter, in_place, dtype, count});
      }
    }
  }
  for (DType dtype : {DType::kBFloat16, DType::kUInt8, DType::kFloat64}) {
    for (int64_t count : {int64_t{1}, int64_t{4099}}) {
      cases.push_back({Kind::kAllGather, false, dtype, count});
      cases.push_back({Kind::kAllGather, true, dtype, count});
      for (int root = 0; root < world; ++root) {
        cases.push_back({Kind::kBroadcast, true, dtype, count, root});
      }
    }
  }
  return cases;
}

// Ranks as threads on one GPU: the local backend over cuda:0's memory
// (CommOptions::device) against the local backend over host memory, for 1-4
// ranks: the copies and rank-order sums run on the GPU with the same bits.
TEST(LocalOnGpuTest, ThreadRanksOnOneGpuMatchTheHostBitwise) {
  ZS_SKIP_WITHOUT_GPUS(1);
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  auto device = CreateCudaDevice(0);
  ASSERT_TRUE(device.ok()) << device.status();
  CommOptions on_gpu;
  on_gpu.device = device->get();
  for (int world = 1; world <= 4; ++world) {
    std::mt19937_64 rng(::zeroshard::testing::Seed() + 100 + world);
    for (const Case& c : AllCases(world)) {
      SCOPED_TRACE(absl::StrFormat("%s, %d thread rank(s) on one GPU", Describe(c), world));
      std::vector<std::vector<uint8_t>> inputs(world);
      for (auto& input : inputs) input = RandomInput(c.dtype, InputElements(c, world), rng);
      std::vector<std::vector<uint8_t>> expected(world), actual(world);
      const Memory host = HostMemory();
      const Memory gpu = GpuMemory();
      ASSERT_TRUE(RunLocalRanks(world, [&](int, Communicator& comm) {
                    return RunRank(comm, host, c, inputs, &expected);
                  }).ok());
      const absl::Status status = RunLocalRanks(
          world,
          [&](int, Communicator& comm) {
            EXPECT_EQ(comm.memory_kind(), DeviceKind::kCuda);
            return RunRank(comm, gpu, c, inputs, &actual);
          },
          on_gpu);
      ASSERT_TRUE(status.ok()) << status;
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(actual[r], expected[r]) << "rank " << r << " differs from the host run";
      }
    }
  }
  // More ranks than the kernel's operand arrays hold: refused up front.
  auto too_many = CreateLocalGroup(9, on_gpu);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument) << too_many.status();
}

TEST(NcclCommunicatorTest, OneGpuMatchesLocalBackendBitwise) {
  ZS_SKIP_WITHOUT_GPUS(1);
  CompareWithLocal(1, AllCases(1));
}

TEST(NcclCommunicatorTest, AllGpusMatchLocalBackendBitwise) {
  ZS_SKIP_WITHOUT_GPUS(2);
  CompareWithLocal(GpuCount(), AllCases(GpuCount()));
}

// Small collectives issued back to back (batched by the backend: one
// descriptor exchange and NCCL group per batch) give the bits of the local
// backend running them one at a time.
TEST(NcclCommunicatorTest, SmallCollectivesIssuedTogetherMatchOneAtATime) {
  ZS_SKIP_WITHOUT_GPUS(1);
  SCOPED_TRACE(::zeroshard::testing::SeedTrace());
  const int world = GpuCount();
  std::mt19937_64 rng(::zeroshard::testing::Seed() + 7);
  std::vector<Case> cases;
  for (const Case& c : AllCases(world)) {
    if (c.count <= 4099) cases.push_back(c);
  }
  const size_t n = cases.size();
  std::vector<std::vector<std::vector<uint8_t>>> inputs, expected, actual;
  ASSERT_TRUE(LocalReference(world, cases, rng, &inputs, &expected, &actual).ok());
  const Memory gpu = GpuMemory();
  Gpus gpus(world);
  const absl::Status status =
      RunNcclLocalRanks(gpus.devices, [&](int, Communicator& comm) -> absl::Status {
        return RunRankIssuedTogether(comm, gpu, cases, inputs, &actual);
      });
  ASSERT_TRUE(status.ok()) << status;
  for (size_t k = 0; k < n; ++k) {
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(actual[k][r], expected[k][r])
          << Describe(cases[k]) << ", rank " << r << " of " << world << ": issued together";
    }
  }
}

TEST(NcclCommunicatorTest, HostMemoryIsRefused) {
  ZS_SKIP_WITHOUT_GPUS(1);
  Gpus gpus(1);
  const absl::Status status = RunNcclLocalRanks(gpus.devices, [](int, Communicator& comm) {
    std::vector<float> host(16, 1.0f);
    return comm.AllReduce(host.data(), host.data(), 16, DType::kFloat32).Wait();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("host memory"));
}

TEST(NcclCommunicatorTest, BarrierAndZeroCountsComplete) {
  ZS_SKIP_WITHOUT_GPUS(1);
  Gpus gpus(GpuCount());
  const absl::Status status = RunNcclLocalRanks(gpus.devices, [](int, Communicator& comm) {
    for (int i = 0; i < 3; ++i) {
      const absl::Status barrier = comm.BarrierSync();
      if (!barrier.ok()) return barrier;
    }
    return comm.AllReduce(nullptr, nullptr, 0, DType::kFloat32).Wait();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(NcclCommunicatorTest, MismatchedTagsFailOnEveryRank) {
  ZS_SKIP_WITHOUT_GPUS(2);
  Gpus gpus(2);
  const absl::Status status = RunNcclLocalRanks(gpus.devices, [](int rank, Communicator& comm) {
    void* buf = nullptr;
    if (cudaMalloc(&buf, 64) != cudaSuccess) return absl::InternalError("cudaMalloc");
    absl::Status result = comm.AllReduce(buf, buf, 16, DType::kFloat32, 1).Wait();
    if (result.ok()) result = comm.AllReduce(buf, buf, 16, DType::kFloat32, 2 + rank).Wait();
    cudaFree(buf);
    return result;
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("tag"));
}

TEST(NcclCommunicatorTest, MissingRankIsDeadlineExceededNotAHang) {
  ZS_SKIP_WITHOUT_GPUS(2);
  Gpus gpus(2);
  CommOptions options;
  options.timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  const absl::Status status = RunNcclLocalRanks(
      gpus.devices,
      [](int rank, Communicator& comm) {
        if (rank == 1) {
          // Alive, with its communicator intact, but never issues the
          // collective until rank 0 has given up.
          absl::SleepFor(absl::Seconds(4));
          return absl::OkStatus();
        }
        void* buf = nullptr;
        if (cudaMalloc(&buf, 64) != cudaSuccess) return absl::InternalError("cudaMalloc");
        absl::Status result = comm.AllReduce(buf, buf, 16, DType::kFloat32).Wait();
        cudaFree(buf);
        return result;
      },
      options);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("a peer of rank 1 did not arrive within 2s"));
  // Creation, the timeout and rank 1's bounded teardown, with slack.
  EXPECT_LT(elapsed, absl::Seconds(30));
}

// A thread rank whose work fails marks itself, and its peers' waiting
// collective fails at once naming it, long before the timeout.
TEST(NcclCommunicatorTest, AFailedThreadRankFailsItsPeersAtOnce) {
  ZS_SKIP_WITHOUT_GPUS(2);
  Gpus gpus(2);
  CommOptions options;
  options.timeout = absl::Seconds(60);
  const absl::Time start = absl::Now();
  absl::Status rank0;
  const absl::Status status = RunNcclLocalRanks(
      gpus.devices,
      [&](int rank, Communicator& comm) {
        if (rank == 1) return absl::InternalError("rank 1's trainer failed");
        void* buf = nullptr;
        if (cudaMalloc(&buf, 64) != cudaSuccess) return absl::InternalError("cudaMalloc");
        rank0 = comm.AllReduce(buf, buf, 16, DType::kFloat32).Wait();
        cudaFree(buf);
        return rank0;
      },
      options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  // The cause is reported, not its consequence on rank 0.
  EXPECT_THAT(status.message(), HasSubstr("rank 1: rank 1's trainer failed"));
  EXPECT_EQ(rank0.code(), absl::StatusCode::kAborted) << rank0;
  EXPECT_THAT(rank0.message(), HasSubstr("rank 1 left the group"));
}

}  // namespace
}  // namespace zeroshard
