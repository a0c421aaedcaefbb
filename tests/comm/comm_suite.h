// One test suite for every communicator backend. The test bodies in
// comm_suite.cc run on each rank of a TestWorld; each test binary says which
// worlds exist (comm_local_test.cc: in-process groups of 1..5 ranks;
// comm_mpi_test.cc: the processes mpirun started).
#ifndef ZEROSHARD_TESTS_COMM_COMM_SUITE_H_
#define ZEROSHARD_TESTS_COMM_COMM_SUITE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"

namespace zeroshard {
namespace testing_comm {

// A group of ranks the same test body runs on.
class TestWorld {
 public:
  virtual ~TestWorld() = default;
  virtual int size() const = 0;
  // Creates a fresh group with `options`, runs `body` on every rank (local:
  // one thread per rank; mpi: this process) and destroys the group.
  virtual void Run(const CommOptions& options,
                   const std::function<void(Communicator& comm)>& body) = 0;
};

struct WorldParam {
  std::string backend;  // "local" or "mpi"
  int size = 0;         // local: ranks; mpi: 0 (whatever mpirun started)
};
std::ostream& operator<<(std::ostream& os, const WorldParam& param);
std::string WorldName(const ::testing::TestParamInfo<WorldParam>& info);

// Defined by each test binary.
std::unique_ptr<TestWorld> MakeWorld(const WorldParam& param);
// The base seed of this run, the same on every rank (mpi: broadcast by main).
uint64_t BaseSeed();

// Random test data that every rank can regenerate for any rank, so each rank
// can build the reference of a reduction alone: element i of rank r's input
// for data set `salt` is a pure function of (seed, salt, r, i).
class TestData {
 public:
  TestData(uint64_t seed, DType dtype) : seed_(seed), dtype_(dtype) {}

  // Raw bits (widened to 64) of element i of rank r's input in data set salt.
  uint64_t Bits(uint64_t salt, int rank, int64_t i) const;
  // The same element as a double.
  double Value(uint64_t salt, int rank, int64_t i) const;
  // count elements of rank r's input starting at element `first`.
  std::vector<uint8_t> Make(uint64_t salt, int rank, int64_t count, int64_t first = 0) const;

  // The documented result of a sum over ranks 0..world-1 of element i:
  // rank-order accumulation in fp32 (16-bit types rounded once), fp64 or
  // int64; returned as raw bits.
  uint64_t RankOrderSumBits(uint64_t salt, int world, int64_t i) const;
  // The exact-ish sum in double precision and the bound the result must be
  // within (accumulation and final rounding error of the dtype).
  void DoubleSum(uint64_t salt, int world, int64_t i, double* sum, double* bound) const;

  DType dtype() const { return dtype_; }

 private:
  uint64_t seed_;
  DType dtype_;
};

// Raw bits of element i of a buffer of `dtype`, and their value as a double.
uint64_t ElementBits(DType dtype, const void* data, int64_t i);
double BitsToDouble(DType dtype, uint64_t bits);

// The indices a large result is checked at: all of them up to 1M elements,
// else a stride plus the neighbourhood of every 2^19 (chunk boundaries).
std::vector<int64_t> IndicesToCheck(int64_t count);

// Checks `result` (count elements) against the sum of data set `salt` over
// `world` ranks, elements [first, first + count): bitwise against the
// rank-order sum and within bound of the double reference. Returns the
// number of bad elements (the first few are reported).
int64_t CheckSum(const TestData& data, uint64_t salt, int world, const void* result, int64_t count,
                 int64_t first, const std::string& what);
// Checks that `result` equals rank `rank`'s input of data set salt,
// elements [first, first + count).
int64_t CheckCopy(const TestData& data, uint64_t salt, int rank, const void* result, int64_t count,
                  int64_t first, const std::string& what);

// An Event that the test opens by hand: a collective issued after it
// (AllReduceAfter) holds the communicator's progress thread until Open(),
// so the collectives issued meanwhile are all queued when the next one
// starts (a backend that batches then sees them together, on every rank).
// Give the gated collective kGatedCount fp32 elements: more than a batch
// takes (1 MiB), it runs alone, and the batches behind it are cut alike on
// every rank whatever the progress thread saw when it took it.
class GateEvent : public Event {
 public:
  static constexpr int64_t kGatedCount = (int64_t{1} << 18) + 1;

  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  absl::Status Record(Stream&) override { return absl::UnimplementedError("GateEvent::Record"); }
  absl::Status Synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
    return absl::OkStatus();
  }
  absl::Status MakeStreamWait(Stream&) override {
    return absl::UnimplementedError("GateEvent::MakeStreamWait");
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class CommSuite : public ::testing::TestWithParam<WorldParam> {
 protected:
  void SetUp() override;
  TestWorld& world() { return *world_; }
  // A seed for this test, derived from the base seed and the test's name.
  uint64_t seed() const { return seed_; }

 private:
  std::unique_ptr<TestWorld> world_;
  uint64_t seed_ = 0;
};

}  // namespace testing_comm
}  // namespace zeroshard

#endif  // ZEROSHARD_TESTS_COMM_COMM_SUITE_H_
