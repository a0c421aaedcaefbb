// ProcessGrid: the rank order (tp fastest, then dp, then pp), the shape
// check at start-up (a mismatched grid is refused on every rank, naming the
// rank), and the groups Create splits off (once Communicator::Split exists).
#include "zeroshard/process_grid.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

TEST(ProcessGridTest, RankOrderIsTpFastestThenDpThenPp) {
  const GridShape shape{/*dp=*/3, /*tp=*/2, /*pp=*/4};
  EXPECT_EQ(shape.ToString(), "dp 3 x tp 2 x pp 4");
  for (int rank = 0; rank < shape.world(); ++rank) {
    const GridCoord c = CoordOf(rank, shape);
    EXPECT_EQ(rank, c.tp + 2 * (c.dp + 3 * c.pp));
    EXPECT_EQ(RankOf(c, shape), rank);
  }
  EXPECT_EQ(RankOf({/*dp=*/1, /*tp=*/1, /*pp=*/0}, shape), 3);
  EXPECT_EQ(RankOf({/*dp=*/0, /*tp=*/0, /*pp=*/1}, shape), 6);
}

// Create on every rank of a local group of `world`, rank r passing shapes[r].
std::vector<absl::Status> CreateOnEveryRank(const std::vector<GridShape>& shapes) {
  std::vector<absl::Status> out(shapes.size());
  std::mutex mu;
  const absl::Status run = RunLocalRanks(static_cast<int>(shapes.size()),
                                         [&](int rank, Communicator& world) -> absl::Status {
                                           auto grid = ProcessGrid::Create(world, shapes[rank]);
                                           std::lock_guard<std::mutex> lock(mu);
                                           out[rank] = grid.status();
                                           return absl::OkStatus();
                                         });
  EXPECT_TRUE(run.ok()) << run;
  return out;
}

TEST(ProcessGridTest, AMismatchedShapeIsRefusedOnEveryRankNamingTheRank) {
  const GridShape good{2, 2, 1};
  const GridShape bad{1, 2, 2};
  const std::vector<absl::Status> statuses = CreateOnEveryRank({good, good, good, bad});
  for (int rank = 0; rank < 4; ++rank) {
    const absl::Status& s = statuses[rank];
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << "rank " << rank << ": " << s;
    EXPECT_NE(s.message().find("rank 3 passed grid dp 1 x tp 2 x pp 2 but rank 0 passed dp 2 x "
                               "tp 2 x pp 1"),
              std::string::npos)
        << s;
  }
}

TEST(ProcessGridTest, AShapeThatDoesNotCoverTheWorldIsRefused) {
  const GridShape three{1, 3, 1};
  for (const absl::Status& s : CreateOnEveryRank({three, three})) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("grid dp 1 x tp 3 x pp 1 needs 3 ranks but the communicator has 2"),
              std::string::npos)
        << s;
  }
  const GridShape zero{0, 2, 1};
  for (const absl::Status& s : CreateOnEveryRank({zero, zero})) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
}

TEST(ProcessGridTest, GroupsHoldTheRanksOfTheirCoordinates) {
  const GridShape shape{/*dp=*/2, /*tp=*/2, /*pp=*/2};
  const absl::Status run =
      RunLocalRanks(shape.world(), [&](int rank, Communicator& world) -> absl::Status {
        auto made = ProcessGrid::Create(world, shape);
        ZS_RETURN_IF_ERROR(made.status());
        ProcessGrid& grid = **made;
        const GridCoord c = grid.coord();
        EXPECT_EQ(RankOf(c, shape), rank);
        // Each group's size, this rank's place in it, and who is in it: the
        // sum of the members' world ranks.
        struct Expect {
          Communicator* comm;
          int size, rank;
          int64_t member_sum;
        };
        int64_t dp_sum = 0, tp_sum = 0, pp_sum = 0, mp_sum = 0;
        for (int r = 0; r < shape.world(); ++r) {
          const GridCoord o = CoordOf(r, shape);
          if (o.tp == c.tp && o.pp == c.pp) dp_sum += r;
          if (o.dp == c.dp && o.pp == c.pp) tp_sum += r;
          if (o.dp == c.dp && o.tp == c.tp) pp_sum += r;
          if (o.dp == c.dp) mp_sum += r;
        }
        const Expect groups[] = {{&grid.dp(), 2, c.dp, dp_sum},
                                 {&grid.tp(), 2, c.tp, tp_sum},
                                 {&grid.pp(), 2, c.pp, pp_sum},
                                 {&grid.model_parallel(), 4, c.tp + 2 * c.pp, mp_sum}};
        for (const Expect& e : groups) {
          EXPECT_EQ(e.comm->size(), e.size) << "rank " << rank;
          EXPECT_EQ(e.comm->rank(), e.rank) << "rank " << rank;
          int64_t mine = rank;
          int64_t sum = 0;
          ZS_RETURN_IF_ERROR(e.comm->AllReduceSync(&mine, &sum, 1, DType::kInt64));
          EXPECT_EQ(sum, e.member_sum) << "rank " << rank;
        }
        EXPECT_EQ(&grid.world(), &world);
        return absl::OkStatus();
      });
  ASSERT_TRUE(run.ok()) << run;
}

}  // namespace
}  // namespace zeroshard
