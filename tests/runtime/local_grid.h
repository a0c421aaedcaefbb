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
// from ProcessGrid::Create.
inline absl::Status RunLocalGrid(const GridShape& shape,
                                 const std::function<absl::Status(const GridRank&)>& fn) {
  CommOptions options;
  options.timeout = absl::Seconds(60);
  return RunLocalRanks(
      shape.world(),
      [&](int rank, Communicator& world) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGrid> grid, ProcessGrid::Create(world, shape));
        GridRank r;
        r.rank = rank;
        r.coord = grid->coord();
        r.dp = &grid->dp();
        r.model_parallel = &grid->model_parallel();
        return fn(r);
      },
      options);
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
