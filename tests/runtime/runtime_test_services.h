// RuntimeServices for the runtime owners' tests: a CPU device, its compute
// stream and ops, a communicator of the test's choice, a collective log and
// a timeline; no engine. It also builds the layout and plan an owner reads.
#ifndef ZEROSHARD_TESTS_RUNTIME_RUNTIME_TEST_SERVICES_H_
#define ZEROSHARD_TESTS_RUNTIME_RUNTIME_TEST_SERVICES_H_

#include <memory>
#include <random>
#include <string>
#include <utility>

#include "engine/src/layout/flat_layout.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/runtime/runtime_services.h"
#include "engine/src/runtime/shard_buffers.h"
#include "engine/src/runtime/step_timeline.h"
#include "zeroshard/status.h"

namespace zeroshard::testing {

class TestServices final : public internal::RuntimeServices {
 public:
  // `comm` must outlive the services.
  static absl::StatusOr<std::unique_ptr<TestServices>> Create(Communicator& comm) {
    auto s = std::unique_ptr<TestServices>(new TestServices(comm));
    ZS_ASSIGN_OR_RETURN(s->stream_, s->device_->CreateStream());
    ZS_ASSIGN_OR_RETURN(s->ops_, internal::CreateDeviceOps(*s->device_, *s->stream_));
    return s;
  }

  Device& device() { return *device_; }
  internal::StepTimeline& timeline() { return timeline_; }

  Communicator& comm() override { return comm_; }
  internal::CollectiveLog& log() override { return log_; }
  internal::DeviceOps& ops() override { return *ops_; }
  absl::Status WaitComm(CommHandle& handle, internal::WaitSite site) override {
    return log_.Wait(handle, site, timeline_);
  }
  absl::Status ZeroOnCompute(void* dst, int64_t bytes) override {
    return device_->ZeroAsync(dst, bytes, *stream_);
  }
  absl::Status CopyOnCompute(void* dst, const void* src, int64_t bytes) const override {
    return device_->CopyAsync(dst, src, bytes, *stream_);
  }
  absl::Status SyncCompute() override { return stream_->Synchronize(); }
  absl::StatusOr<std::shared_ptr<Event>> RecordCompute() override {
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device_->CreateEvent());
    ZS_RETURN_IF_ERROR(event->Record(*stream_));
    return std::shared_ptr<Event>(std::move(event));
  }
  absl::Status HostAllGather(const int64_t* mine, int64_t* all, int64_t count) override {
    CommHandle h = comm_.AllGather(mine, all, count, DType::kInt64);
    return WaitComm(h, internal::WaitSite::kRecordExchange);
  }
  absl::Status HostBroadcast(int64_t* words, int64_t count, int root) override {
    CommHandle h = comm_.Broadcast(words, count, DType::kInt64, root);
    return WaitComm(h, internal::WaitSite::kRecordExchange);
  }

 private:
  explicit TestServices(Communicator& comm)
      : comm_(comm), device_(CreateCpuDevice()), log_(/*check_sequence=*/true) {}

  Communicator& comm_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<internal::DeviceOps> ops_;
  internal::CollectiveLog log_;
  internal::StepTimeline timeline_;
};

// Declared after the buffers a test allocates (and before the owners that
// wait for their collectives): on every return, an error's included, the
// work queued on the stream finishes before the buffers are freed, as the
// engine's declaration order ensures for its own.
class StreamDrain {
 public:
  explicit StreamDrain(TestServices& services) : services_(services) {}
  ~StreamDrain() { services_.SyncCompute().IgnoreError(); }

 private:
  TestServices& services_;
};

// One rank's set-up for an owner's test: the layout and plan of `model`
// over `world` ranks, the services on `comm`, this rank's fp32 buffers
// allocated, and the drain (destroyed first, so queued work finishes before
// the buffers go). Heap-held: the buffers refer to the layout and plan.
struct RankRig {
  internal::FlatLayout layout;
  BufferPlan plan;
  std::unique_ptr<TestServices> services;
  std::unique_ptr<internal::ShardBuffers> buffers;
  std::unique_ptr<StreamDrain> drain;

  RankRig(internal::FlatLayout l, BufferPlan p) : layout(std::move(l)), plan(std::move(p)) {}

  static absl::StatusOr<std::unique_ptr<RankRig>> Create(const ModelSpec& model,
                                                         const TrainSpec& train, int world,
                                                         int rank, Communicator& comm) {
    ZS_ASSIGN_OR_RETURN(internal::FlatLayout layout, internal::FlatLayout::Create(model, world));
    ZS_ASSIGN_OR_RETURN(BufferPlan plan, internal::PlanBuffers(layout, train));
    auto rig = std::unique_ptr<RankRig>(new RankRig(std::move(layout), std::move(plan)));
    ZS_ASSIGN_OR_RETURN(rig->services, TestServices::Create(comm));
    rig->buffers = std::make_unique<internal::ShardBuffers>(rig->layout, rig->plan, rank,
                                                            DType::kFloat32, DType::kFloat32);
    ZS_RETURN_IF_ERROR(rig->buffers->Allocate(rig->services->device()));
    rig->drain = std::make_unique<StreamDrain>(*rig->services);
    return rig;
  }
};

// A model of `units` units, each of 1-3 params of random sizes (some not a
// multiple of the alignment, so that units have padding), every other
// param no_decay. The same on every rank for the same `rng` state.
inline ModelSpec RandomModel(std::mt19937_64& rng, int units) {
  ModelSpec spec;
  for (int u = 0; u < units; ++u) {
    UnitSpec unit;
    unit.name = "unit." + std::to_string(u);
    const int params = 1 + static_cast<int>(rng() % 3);
    for (int p = 0; p < params; ++p) {
      ParamSpec param;
      param.name = "p" + std::to_string(p);
      param.shape = {1 + static_cast<int64_t>(rng() % 300)};
      param.no_decay = (p % 2) == 1;
      unit.params.push_back(std::move(param));
    }
    spec.units.push_back(std::move(unit));
  }
  return spec;
}

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_RUNTIME_RUNTIME_TEST_SERVICES_H_
