// The communicator suite on the mpi backend. Run under mpirun (ctest does it
// with -np 2 and -np 3): every process is one rank. Only rank 0 prints the
// GoogleTest report; other ranks print their own failures, prefixed with
// their rank, and every rank exits non-zero when any rank failed.
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/src/comm/async_communicator.h"
#include "engine/src/comm/collective_batch.h"
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

// Under one mpirun on one machine every rank shares the node (MPI's
// shared-memory split), named by this host; a Split group keeps it.
// (tests/multinode runs ranks on two emulated nodes.)
TEST(MpiNodeLayout, OneMachineIsOneNodeOfEveryRank) {
  auto created = CreateMpiCommunicator();
  ASSERT_TRUE(created.ok()) << created.status();
  Communicator& comm = **created;
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const NodeLayout layout = comm.node_layout();
  EXPECT_EQ(layout.source, "MPI_COMM_TYPE_SHARED");
  EXPECT_EQ(layout.node_of_rank, std::vector<int>(comm.size(), 0));
  EXPECT_EQ(layout.node_names, std::vector<std::string>({host}));
  auto odd = comm.Split(comm.rank() % 2, 0);
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ((*odd)->node_layout().node_of_rank, std::vector<int>((*odd)->size(), 0));
}

// The mpi backend runs small collectives queued together as batches: 48
// all-reduces queued behind a gated one (GateEvent) go as three batches of
// kMaxBatchOps on every rank (AsyncCommunicator::batched_collectives), and
// each sum has the bits of the rank-order sum. With batching off (max_batch
// 1) the count stays 0.
TEST(MpiBatching, SmallCollectivesQueuedTogetherRunInBatches) {
  auto created = CreateMpiCommunicator();
  ASSERT_TRUE(created.ok()) << created.status();
  Communicator& comm = **created;
  auto* async = dynamic_cast<internal::AsyncCommunicator*>(&comm);
  ASSERT_NE(async, nullptr);
  const int world = comm.size();
  const int rank = comm.rank();
  struct Op {
    TestData data;
    int64_t count;
    uint64_t salt;
    std::vector<uint8_t> buf;
    CommHandle handle;
  };
  constexpr int kOps = 3 * internal::kMaxBatchOps;
  std::mt19937_64 rng(BaseSeed() + 17);  // the same counts on every rank
  std::vector<Op> ops;
  for (int i = 0; i < kOps; ++i) {
    const TestData data(BaseSeed(), i % 2 == 0 ? DType::kFloat32 : DType::kBFloat16);
    const int64_t count = 1 + static_cast<int64_t>(rng() % 200);
    const uint64_t salt = 5000 + i;
    ops.push_back(Op{data, count, salt, data.Make(salt, rank, count), {}});
  }
  std::vector<float> gated(GateEvent::kGatedCount, 1.0f);
  auto gate = std::make_shared<GateEvent>();
  CommHandle first = comm.AllReduceAfter(gate, gated.data(), gated.data(), GateEvent::kGatedCount,
                                         DType::kFloat32, /*tag=*/0);
  for (Op& op : ops) {
    op.handle = comm.AllReduce(op.buf.data(), op.buf.data(), op.count, op.data.dtype());
  }
  gate->Open();
  ASSERT_TRUE(first.Wait().ok()) << first.Wait();
  for (int i = 0; i < kOps; ++i) {
    Op& op = ops[i];
    const std::string what = "AllReduce " + std::to_string(i) + " on rank " + std::to_string(rank);
    const absl::Status status = op.handle.Wait();
    ASSERT_TRUE(status.ok()) << what << ": " << status;
    EXPECT_EQ(CheckSum(op.data, op.salt, world, op.buf.data(), op.count, 0, what), 0);
  }
  EXPECT_EQ(async->batched_collectives(), static_cast<uint64_t>(kOps))
      << "rank " << rank << ": the collectives queued together did not run as batches; "
      << ::zeroshard::testing::SeedTrace();
}

#ifdef OPEN_MPI
// The value Open MPI runs with for one of its control variables (MPI_T).
uint64_t OpenMpiControlVariable(const char* name) {
  int provided = 0;
  // MULTIPLE: Open MPI 4.1 takes MPI_T's level as MPI_Query_thread's answer.
  EXPECT_EQ(MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided), MPI_SUCCESS);
  int index = -1;
  EXPECT_EQ(MPI_T_cvar_get_index(name, &index), MPI_SUCCESS) << name;
  MPI_T_cvar_handle handle;
  int count = 0;
  EXPECT_EQ(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), MPI_SUCCESS) << name;
  EXPECT_EQ(count, 1) << name;
  uint64_t value = 0;  // wide enough for Open MPI's int and size_t variables
  EXPECT_EQ(MPI_T_cvar_read(handle, &value), MPI_SUCCESS) << name;
  MPI_T_cvar_handle_free(&handle);
  MPI_T_finalize();
  return value;
}

// CreateMpiCommunicator initialised MPI (main below) with the engine's
// transport defaults: 256 KiB fragments, 64 in flight. ctest sets none of
// these variables itself, so each must be the engine's value.
TEST(MpiTransportDefaults, OpenMpiRunsWithTheEnginesFragmentSizes) {
  for (const char* name :
       {"OMPI_MCA_btl_vader_max_send_size", "OMPI_MCA_pml_ob1_send_pipeline_depth"}) {
    ASSERT_NE(std::getenv(name), nullptr) << name << " was not set before MPI_Init";
  }
  EXPECT_EQ(OpenMpiControlVariable("pml_ob1_send_pipeline_depth") & 0xffffffffu, 64u);
  EXPECT_EQ(OpenMpiControlVariable("pml_ob1_recv_pipeline_depth") & 0xffffffffu, 64u);
  const uint64_t send = OpenMpiControlVariable("btl_vader_max_send_size");
  // size_t (8 bytes) or a 4-byte integer type: either way 262144 in the low bits.
  EXPECT_TRUE(send == 262144u || (send & 0xffffffffu) == 262144u) << send;
}
#endif

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
