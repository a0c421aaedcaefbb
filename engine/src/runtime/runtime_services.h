// RuntimeServices: what the engine's owners (GradReducer, ParamGatherer,
// CheckpointWriter, ...) ask of the engine that orchestrates them: its
// communicator and collective log, and the compute stream with its
// ordering rules. EngineImpl implements it; an owner's test implements it
// with a plain CPU device.
#ifndef ZEROSHARD_RUNTIME_RUNTIME_SERVICES_H_
#define ZEROSHARD_RUNTIME_RUNTIME_SERVICES_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/src/device/device_ops.h"
#include "engine/src/runtime/collective_log.h"
#include "zeroshard/communicator.h"
#include "zeroshard/device.h"

namespace zeroshard::internal {

class RuntimeServices {
 public:
  virtual ~RuntimeServices() = default;

  virtual Communicator& comm() = 0;
  // Every collective an owner issues is noted here (the sequence check).
  virtual CollectiveLog& log() = 0;
  // The per-step arithmetic, enqueued on the compute stream.
  virtual DeviceOps& ops() = 0;

  // Waits on `handle`, booked to `site` (CollectiveLog::Wait); a failed
  // collective poisons the engine.
  virtual absl::Status WaitComm(CommHandle& handle, WaitSite site) = 0;
  // Enqueues a zeroing of `bytes` device bytes at `dst` on the compute stream.
  virtual absl::Status ZeroOnCompute(void* dst, int64_t bytes) = 0;
  // Enqueues a copy between host memory and the device's buffers (either
  // direction), or between two device buffers, on the compute stream; the
  // host memory must live until the next SyncCompute.
  virtual absl::Status CopyOnCompute(void* dst, const void* src, int64_t bytes) const = 0;
  // Waits for the compute stream: before the host or the communicator
  // touches a buffer that enqueued work reads or writes. A failure poisons
  // the engine.
  virtual absl::Status SyncCompute() = 0;
  // An event marking the work enqueued on the compute stream so far (for a
  // collective that must start after it: Communicator::AllReduceAfter).
  virtual absl::StatusOr<std::shared_ptr<Event>> RecordCompute() = 0;
  // Collectives on small int64 records that live in host memory (start-up,
  // norm, checkpoint agreement), waited for (WaitSite::kRecordExchange).
  virtual absl::Status HostAllGather(const int64_t* mine, int64_t* all, int64_t count) = 0;
  virtual absl::Status HostBroadcast(int64_t* words, int64_t count, int root) = 0;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_RUNTIME_SERVICES_H_
