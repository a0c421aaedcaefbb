#include "zeroshard/process_grid.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard {

std::string GridShape::ToString() const {
  return absl::StrFormat("dp %d x tp %d x pp %d", dp, tp, pp);
}

GridCoord CoordOf(int rank, const GridShape& shape) {
  GridCoord c;
  c.tp = rank % shape.tp;
  c.dp = (rank / shape.tp) % shape.dp;
  c.pp = rank / (shape.tp * shape.dp);
  return c;
}

int RankOf(const GridCoord& coord, const GridShape& shape) {
  return coord.tp + shape.tp * (coord.dp + shape.dp * coord.pp);
}

namespace {

class ProcessGridImpl final : public ProcessGrid {
 public:
  ProcessGridImpl(Communicator& world, const GridShape& shape, const GridCoord& coord)
      : world_(world), shape_(shape), coord_(coord) {}

  const GridShape& shape() const override { return shape_; }
  const GridCoord& coord() const override { return coord_; }
  Communicator& world() override { return world_; }
  Communicator& dp() override { return *dp_; }
  Communicator& tp() override { return *tp_; }
  Communicator& pp() override { return *pp_; }
  Communicator& model_parallel() override { return *model_parallel_; }

  // Splits `world_` into the four groups; collective, in the same order on
  // every rank.
  absl::Status Split() {
    const GridCoord& c = coord_;
    const GridShape& s = shape_;
    // Color: the coordinates the group's ranks share; key: the coordinate
    // that orders them.
    ZS_ASSIGN_OR_RETURN(dp_, world_.Split(c.tp + s.tp * c.pp, c.dp));
    ZS_ASSIGN_OR_RETURN(tp_, world_.Split(c.dp + s.dp * c.pp, c.tp));
    ZS_ASSIGN_OR_RETURN(pp_, world_.Split(c.tp + s.tp * c.dp, c.pp));
    ZS_ASSIGN_OR_RETURN(model_parallel_, world_.Split(c.dp, c.tp + s.tp * c.pp));
    return absl::OkStatus();
  }

 private:
  Communicator& world_;
  GridShape shape_;
  GridCoord coord_;
  // Destroyed before world_ goes (they must not outlive it).
  std::unique_ptr<Communicator> dp_, tp_, pp_, model_parallel_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGrid>> ProcessGrid::Create(Communicator& world,
                                                                 const GridShape& shape) {
  // The exchange and Split move small host records: the nccl backend, whose
  // collectives need device buffers, is not supported yet.
  if (world.memory_kind() != DeviceKind::kCpu) {
    return absl::UnimplementedError(absl::StrFormat(
        "ProcessGrid::Create: the '%s' communicator moves GPU memory; the grid needs a host "
        "memory communicator (local or mpi) for now",
        world.backend()));
  }
  // Every rank's shape first, before any rank can refuse its own: a rank
  // that returned early would leave the others waiting in the exchange.
  // Every rank then sees the same records and returns the same error.
  const int64_t mine[3] = {shape.dp, shape.tp, shape.pp};
  std::vector<int64_t> all(3 * static_cast<size_t>(world.size()));
  ZS_RETURN_IF_ERROR(world.AllGather(mine, all.data(), 3, DType::kInt64).Wait());
  const auto shape_of = [&all](int r) {
    GridShape s;
    s.dp = static_cast<int>(all[3 * r]);
    s.tp = static_cast<int>(all[3 * r + 1]);
    s.pp = static_cast<int>(all[3 * r + 2]);
    return s;
  };
  const GridShape first = shape_of(0);
  for (int r = 1; r < world.size(); ++r) {
    const GridShape other = shape_of(r);
    if (other.dp != first.dp || other.tp != first.tp || other.pp != first.pp) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "ProcessGrid::Create: rank %d passed grid %s but rank 0 passed %s; every rank must "
          "pass the same grid shape (check the launch flags of rank %d)",
          r, other.ToString(), first.ToString(), r));
    }
  }
  if (shape.dp < 1 || shape.tp < 1 || shape.pp < 1 ||
      int64_t{shape.dp} * shape.tp * shape.pp != world.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ProcessGrid::Create: grid %s needs %d ranks but the communicator has %d; choose dp, tp "
        "and pp (each >= 1) whose product is the number of ranks",
        shape.ToString(), int64_t{shape.dp} * shape.tp * shape.pp, world.size()));
  }
  auto grid = std::make_unique<ProcessGridImpl>(world, shape, CoordOf(world.rank(), shape));
  ZS_RETURN_IF_ERROR(grid->Split());
  return std::unique_ptr<ProcessGrid>(std::move(grid));
}

}  // namespace zeroshard
