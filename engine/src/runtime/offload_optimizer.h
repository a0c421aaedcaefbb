// OffloadOptimizer: the optimizer state on the host or NVMe tier
// (TrainSpec::offload, docs/offload.md), and the update that streams to it.
//
// The state of a rank is one flat space of elements (ShardBuffers::
// OptimizerIndex): the fp32 master (mixed precision only), Adam's m and v.
// On the host tier they are host buffers; on the NVMe tier they are swap
// files, one per tensor (swap_files.h), of which the host holds four chunks
// per tensor (kOffloadStateSlots). Apply cuts the space into chunks of BufferPlan::
// offload_chunk_numel elements and runs, per chunk c:
//
//   copy stream (device):  gradients (and fp32 params) of c+1 -> host   | params of c -> device
//   host stream:           AdamW of c (the CPU kernels: ShardOptimizer's pieces)
//   I/O (NVMe):            read state of c+1 and c+2, write state of c-1
//
// so the copies and the I/O of one chunk run while the host updates the
// next. The host thread orders it with events only (it waits for an event,
// then enqueues), which means the same on CPU and CUDA streams. The update
// is element-wise, so cutting the runs into pieces changes no bit: the
// weights equal the device tier's.
#ifndef ZEROSHARD_RUNTIME_OFFLOAD_OPTIMIZER_H_
#define ZEROSHARD_RUNTIME_OFFLOAD_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/src/device/device_ops.h"
#include "engine/src/layout/flat_layout.h"
#include "engine/src/offload/swap_files.h"
#include "engine/src/plan/buffer_plan.h"
#include "engine/src/runtime/shard_buffers.h"
#include "engine/src/runtime/shard_optimizer.h"
#include "zeroshard/device.h"

namespace zeroshard::internal {

// kParams: the param shards in the param dtype (OffloadSpec::params nvme).
enum class StateTensor { kMaster = 0, kAdamM = 1, kAdamV = 2, kParams = 3 };

// What the last Apply moved and where its host thread waited.
struct OffloadStepStats {
  int64_t chunks = 0;
  int64_t bytes_to_host = 0;    // gradients (and fp32 params), device -> host
  int64_t bytes_to_device = 0;  // updated params, host -> device
  int64_t bytes_read = 0;       // NVMe
  int64_t bytes_written = 0;    // NVMe
  absl::Duration total;         // the whole Apply
  absl::Duration wait_copy_in;  // host waiting for a chunk's gradients
  absl::Duration wait_update;   // host waiting for a chunk's update
  absl::Duration wait_read;     // host waiting for a chunk's state from NVMe
  absl::Duration wait_drain;    // host waiting for the last copies and writes
};

// Parts of Apply to leave out, for the benchmark (perf/runtime/offload_bench)
// that times the copies, the update and the I/O alone; the engine runs all.
struct OffloadApplyParts {
  bool copies = true;
  bool update = true;
  bool io = true;
};

class OffloadOptimizer {
 public:
  // `buffers` holds the host tier's buffers already (ShardBuffers::Allocate);
  // `swap` is the NVMe tier's files (null on the host tier). All must outlive
  // this object.
  OffloadOptimizer(const FlatLayout& layout, const BufferPlan& plan, const ShardBuffers& buffers,
                   bool mixed, DType param_dtype, DType grad_dtype, Device& device, Device& host,
                   std::unique_ptr<SwapFiles> swap);
  ~OffloadOptimizer();

  // The swap files of `plan`'s NVMe-tier buffers (one per buffer, in plan
  // order: the order FileOf assumes) under `dir`, for rank `rank`.
  static absl::StatusOr<std::unique_ptr<SwapFiles>> CreateSwapFiles(const BufferPlan& plan,
                                                                    const std::string& dir,
                                                                    int rank);

  // The streams, events and host ops.
  absl::Status Init();

  MemoryTier tier() const { return swap_ ? MemoryTier::kNvme : MemoryTier::kHost; }

  // Synchronous access to `n` elements of a state tensor from flat index
  // `index` (host memory `data`: fp32, or the param dtype for kParams),
  // outside Apply: SetParam, Load, Save, GetParam. kMaster only with mixed
  // precision (with fp32 the params are the master); kParams only with the
  // params on NVMe.
  absl::Status Read(StateTensor tensor, int64_t index, int64_t n, void* data);
  absl::Status Write(StateTensor tensor, int64_t index, int64_t n, const void* data);
  // Read, into device memory `device` (through the host: a Gather's shard
  // with the params on NVMe).
  absl::Status ReadToDevice(StateTensor tensor, int64_t index, int64_t n, void* device);

  // One update of every run of `optimizer` (after its BeginStep-less
  // interface: Apply calls BeginStep), streamed chunk by chunk; returns when
  // the device's params hold the updated values. The caller has finished
  // the device work that writes the gradients.
  absl::Status Apply(ShardOptimizer& optimizer, double grad_scale, double lr,
                     const OffloadApplyParts& parts = {});

  // OffloadSpec::grads host: copies the reduced gradient of `unit`'s owned
  // range to the host shard on the copy stream, after `after` (the compute
  // stream's work that finishes the gradient). Called by the reducer's
  // final-gradient hook, during the backward; a no-op otherwise.
  absl::Status OnGradFinal(int unit, const std::shared_ptr<Event>& after);
  // Waits for the copies OnGradFinal enqueued (a skipped step's: the next
  // step's reductions overwrite the device gradients they read).
  absl::Status Quiesce();
  // OffloadSpec::params host: copies `bytes` from host memory to device
  // memory on a stream of its own and waits for it (ParamGatherer's fetch).
  absl::Status FetchShard(void* device, const void* host, int64_t bytes);

  // NVMe: every swap file still is ours and whole (once per step); OK on
  // the host tier.
  absl::Status CheckFiles() const;
  // "host tier: 2 chunks of 1048576 elements" or the swap files' I/O line.
  std::string Describe() const;
  const OffloadStepStats& last_stats() const { return stats_; }

 private:
  struct Piece {
    size_t run;         // index in ShardOptimizer::runs()
    int unit;           // the run's unit
    int64_t seg_begin;  // segment coordinates of the piece's first element
    int64_t n;          // elements
    int64_t at;         // offset in the chunk
  };
  struct Chunk {
    int64_t index;  // flat index of its first element
    int64_t numel;  // elements (the last chunk may be short)
    std::vector<Piece> pieces;
  };

  // The state slots' tensors (BufferPlan::offload_state_tensors).
  int num_tensors() const { return plan_.offload_state_tensors; }
  // The tensors in the swap files, in file order: master (mixed precision),
  // m, v, and the params with OffloadSpec::params nvme.
  std::vector<StateTensor> SwappedTensors() const;
  // The swap file of `tensor`.
  int FileOf(StateTensor tensor) const;
  int64_t ElementSize(StateTensor tensor) const;
  // On the host tier: the host buffer of `tensor`.
  float* HostState(StateTensor tensor) const;
  // On the NVMe tier: state slot `slot` (0-2) of `tensor`.
  float* SlotState(int slot, StateTensor tensor) const;
  void BuildChunks(const std::vector<UpdateRun>& runs);
  absl::Status CopyIn(const Chunk& chunk, int slot);
  absl::Status CopyOut(const Chunk& chunk, int slot);
  absl::Status Update(const ShardOptimizer& optimizer, const Chunk& chunk, int slot,
                      int state_slot);
  // Starts the reads (or writes) of every swapped tensor's part of `chunk`
  // into (from) state slot `state_slot`.
  absl::Status IssueIo(const Chunk& chunk, int state_slot, bool write);
  absl::Status WaitTickets(std::vector<SwapFiles::Ticket>& tickets);
  int64_t ChunkIoBytes(const Chunk& chunk, StateTensor tensor) const;
  // Aligned windows of at most a chunk's fp32 bytes over [index, index + n)
  // of `tensor`'s file: fn(file offset, window bytes, byte offset of the
  // first wanted element in the window, first wanted element, elements).
  template <typename Fn>
  absl::Status ForEachWindow(StateTensor tensor, int64_t index, int64_t n, Fn fn);
  // Reads [index, index + n) of `tensor`'s file window by window through
  // the bounce slot; sink(bytes into the destination, bounce data, bytes).
  template <typename Sink>
  absl::Status ReadWindows(StateTensor tensor, int64_t index, int64_t n, Sink sink);

  const FlatLayout& layout_;
  const BufferPlan& plan_;
  const ShardBuffers& buffers_;
  bool mixed_;
  DType param_dtype_;
  DType grad_dtype_;
  Device& device_;
  Device& host_;
  std::unique_ptr<SwapFiles> swap_;
  int64_t chunk_numel_;
  bool grads_on_host_;               // OffloadSpec::grads host (kOffloadGradShardBuffer)
  bool params_on_nvme_;              // OffloadSpec::params nvme: kParams in the swap files
  int64_t backward_grad_bytes_ = 0;  // copied by OnGradFinal since the last Apply
  int64_t state_numel_;              // the flat space's size

  std::unique_ptr<Stream> copy_;         // a stream of the device
  std::unique_ptr<Stream> fetch_;        // a stream of the device: FetchShard
  std::unique_ptr<Stream> host_stream_;  // a stream of the host tier
  std::unique_ptr<DeviceOps> host_ops_;
  std::unique_ptr<Event> copied_in_[2];  // on copy_: chunk slot's inputs on the host
  std::unique_ptr<Event> updated_[2];    // on host_stream_: chunk slot's update done
  std::vector<SwapFiles::Ticket> reads_[kOffloadStateSlots];
  std::vector<SwapFiles::Ticket> writes_[kOffloadStateSlots];
  std::vector<Chunk> chunks_;
  OffloadStepStats stats_;
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_OFFLOAD_OPTIMIZER_H_
