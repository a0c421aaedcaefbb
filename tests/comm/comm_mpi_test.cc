// The communicator suite on the mpi backend. Run under mpirun (ctest does it
// with -np 2 and -np 3): every process is one rank. Only rank 0 prints the
// GoogleTest report; other ranks print their own failures, prefixed with
// their rank, and every rank exits non-zero when any rank failed.
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/comm/comm_suite.h"
#include "tests/test_seed.h"

namespace zeroshard {
namespace testing_comm {
namespace {

int g_world_size = 0;
uint64_t g_seed = 0;

class MpiWorld : public TestWorld {
 public:
  int size() const override { return g_world_size; }
  void Run(const CommOptions& options,
           const std::function<void(Communicator& comm)>& body) override {
    // Creation is collective: every rank runs the same tests in the same order.
    auto comm = CreateMpiCommunicator(options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    body(**comm);
  }
};

// Prints failed assertions of a non-zero rank, so they are not lost.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

std::unique_ptr<TestWorld> MakeWorld(const WorldParam& param) {
  return std::make_unique<MpiWorld>();
}

uint64_t BaseSeed() { return g_seed; }

INSTANTIATE_TEST_SUITE_P(Mpi, CommSuite, ::testing::Values(WorldParam{"mpi", 0}), WorldName);

}  // namespace testing_comm
}  // namespace zeroshard

int main(int argc, char** argv) {
  using zeroshard::testing_comm::g_seed;
  using zeroshard::testing_comm::g_world_size;
  int rank = 0;
  {
    // The first communicator initialises MPI at the thread level the library
    // needs; FinalizeMpi() below shuts it down again.
    auto comm = zeroshard::CreateMpiCommunicator();
    if (!comm.ok()) {
      std::fprintf(stderr, "comm_mpi_test: %s\n", std::string(comm.status().message()).c_str());
      return 1;
    }
    rank = (*comm)->rank();
    g_world_size = (*comm)->size();
  }
  // Rank 0 alone draws the seed (or reads ZS_TEST_SEED) and prints it; every
  // rank must generate the same data, so the others receive it.
  uint64_t seed = 0;
  if (rank == 0) {
    std::printf("comm_mpi_test: %d ranks\n", g_world_size);
    seed = ::zeroshard::testing::Seed();
  }
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  g_seed = seed;

  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new zeroshard::testing_comm::RankFailurePrinter(rank));
  }
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = local_failed;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !local_failed) {
    std::fprintf(stderr, "comm_mpi_test: another rank failed (see its [rank N] lines)\n");
  }
  zeroshard::FinalizeMpi();
  return any_failed;
}
