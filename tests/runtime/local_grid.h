// Runs a function on every rank of a dp x tp x pp grid of local ranks, with
// the rank's data-parallel and model-parallel groups, and the model-parallel
// engine step the grid tests share.
#ifndef ZEROSHARD_TESTS_RUNTIME_LOCAL_GRID_H_
#define ZEROSHARD_TESTS_RUNTIME_LOCAL_GRID_H_

#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "zeroshard/communicator.h"
#include "zeroshard/engine.h"
#include "zeroshard/process_grid.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {

struct GridRank {
  int rank = 0;  // in the world
  GridCoord coord;
  Communicator* dp = nullptr;              // the engine's communicator
  Communicator* model_parallel = nullptr;  // ModelParallelOptions::group
};

// RunLocalRanks over shape.world() ranks, each calling fn with its groups
// from ProcessGrid::Create. While this build's Communicator::Split answers
// Unimplemented (it lands with the comm branch), the groups are separate
// local groups made here instead, one per (tp, pp) position and one per dp
// index, with the same membership and order; `*used_process_grid` says which.
inline absl::Status RunLocalGrid(const GridShape& shape,
                                 const std::function<absl::Status(const GridRank&)>& fn,
                                 bool* used_process_grid = nullptr) {
  CommOptions options;
  options.timeout = absl::Seconds(60);
  std::vector<std::vector<std::unique_ptr<Communicator>>> dp_groups;
  for (int position = 0; position < shape.tp * shape.pp; ++position) {
    ZS_ASSIGN_OR_RETURN(auto group, CreateLocalGroup(shape.dp, options));
    dp_groups.push_back(std::move(group));
  }
  std::vector<std::vector<std::unique_ptr<Communicator>>> mp_groups;
  for (int d = 0; d < shape.dp; ++d) {
    ZS_ASSIGN_OR_RETURN(auto group, CreateLocalGroup(shape.tp * shape.pp, options));
    mp_groups.push_back(std::move(group));
  }
  std::vector<int> grid_made(shape.world(), 0);
  ZS_RETURN_IF_ERROR(RunLocalRanks(
      shape.world(),
      [&](int rank, Communicator& world) -> absl::Status {
        GridRank r;
        r.rank = rank;
        r.coord = CoordOf(rank, shape);
        auto grid = ProcessGrid::Create(world, shape);
        if (grid.ok()) {
          r.dp = &(*grid)->dp();
          r.model_parallel = &(*grid)->model_parallel();
          grid_made[rank] = 1;
          return fn(r);
        }
        if (grid.status().code() != absl::StatusCode::kUnimplemented) return grid.status();
        const int position = r.coord.tp + shape.tp * r.coord.pp;
        r.dp = dp_groups[position][r.coord.dp].get();
        r.model_parallel = mp_groups[r.coord.dp][position].get();
        return fn(r);
      },
      options));
  if (used_process_grid != nullptr) *used_process_grid = grid_made[0] != 0;
  return absl::OkStatus();
}

// One micro-batch loop of the engine contract: for every unit in backward
// order Gather, GradView, `write(unit, param, view)`, ReduceGrads, Release;
// grad_accum_steps times, then Step().
inline absl::StatusOr<StepResult> StepWithGradients(
    Engine& engine, const std::function<void(int, int, const TensorView&)>& write) {
  const int units = static_cast<int>(engine.model().units.size());
  for (int micro = 0; micro < engine.train().grad_accum_steps; ++micro) {
    for (int u = units - 1; u >= 0; --u) {
      ZS_RETURN_IF_ERROR(engine.Gather(u).status());
      ZS_ASSIGN_OR_RETURN(UnitView grads, engine.GradView(u));
      for (size_t p = 0; p < grads.params.size(); ++p) {
        write(u, static_cast<int>(p), grads.params[p]);
      }
      ZS_RETURN_IF_ERROR(engine.ReduceGrads(u));
      ZS_RETURN_IF_ERROR(engine.Release(u));
    }
  }
  return engine.Step();
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_RUNTIME_LOCAL_GRID_H_
