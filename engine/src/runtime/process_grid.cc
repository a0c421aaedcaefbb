#include "zeroshard/process_grid.h"

#include "absl/strings/str_format.h"

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

absl::StatusOr<std::unique_ptr<ProcessGrid>> ProcessGrid::Create(Communicator& world,
                                                                 const GridShape& shape) {
  // TODO(issue 11): the shape check and the sub-groups (Communicator::Split).
  return absl::UnimplementedError("ProcessGrid::Create is not implemented yet");
}

}  // namespace zeroshard
