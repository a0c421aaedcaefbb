// SaveSlices' state (engine_save_slices.cc): the whole model's layout over
// the grid's world, services that route the checkpoint writer's
// collectives to that world, and the writer.
#ifndef ZEROSHARD_RUNTIME_SLICE_CHECKPOINT_H_
#define ZEROSHARD_RUNTIME_SLICE_CHECKPOINT_H_

#include <cstdint>
#include <memory>

#include "engine/src/layout/flat_layout.h"
#include "engine/src/runtime/checkpoint_writer.h"
#include "engine/src/runtime/runtime_services.h"
#include "zeroshard/communicator.h"
#include "zeroshard/model_spec.h"

namespace zeroshard::internal {

// The engine's services with `world` as the communicator: the writer's
// directory check, verdicts and commit run over every rank of the grid.
// The world moves host memory (local, mpi: ProcessGrid requires it).
class WorldServices final : public RuntimeServices {
 public:
  WorldServices(RuntimeServices& engine, Communicator& world) : engine_(engine), world_(world) {}
  Communicator& comm() override { return world_; }
  CollectiveLog& log() override { return engine_.log(); }
  DeviceOps& ops() override { return engine_.ops(); }
  absl::Status WaitComm(CommHandle& handle, WaitSite site) override {
    return engine_.WaitComm(handle, site);
  }
  absl::Status ZeroOnCompute(void* dst, int64_t bytes) override {
    return engine_.ZeroOnCompute(dst, bytes);
  }
  absl::Status CopyOnCompute(void* dst, const void* src, int64_t bytes) const override {
    return engine_.CopyOnCompute(dst, src, bytes);
  }
  absl::Status SyncCompute() override { return engine_.SyncCompute(); }
  absl::StatusOr<std::shared_ptr<Event>> RecordCompute() override {
    return engine_.RecordCompute();
  }
  absl::Status HostAllGather(const int64_t* mine, int64_t* all, int64_t count) override {
    CommHandle handle = world_.AllGather(mine, all, count, DType::kInt64);
    return engine_.WaitComm(handle, WaitSite::kRecordExchange);
  }
  absl::Status HostBroadcast(int64_t* words, int64_t count, int root) override {
    CommHandle handle = world_.Broadcast(words, count, DType::kInt64, root);
    return engine_.WaitComm(handle, WaitSite::kRecordExchange);
  }

 private:
  RuntimeServices& engine_;
  Communicator& world_;
};

struct SliceCheckpoint {
  ModelSpec whole;
  FlatLayout layout;  // of `whole` over world->size() ranks
  Communicator* world = nullptr;
  std::unique_ptr<WorldServices> services;
  std::unique_ptr<CheckpointWriter> writer;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_SLICE_CHECKPOINT_H_
