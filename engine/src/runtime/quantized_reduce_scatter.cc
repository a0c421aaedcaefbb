#include "engine/src/runtime/quantized_reduce_scatter.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "engine/src/comm/comm_op.h"
#include "engine/src/common/convert.h"
#include "kernels/common/quant_int8.h"
#include "zeroshard/buffer_plan.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

using kernels::kQuantBlock;

// The planner sizes the scratch with its own copy of the pack format.
static_assert(QgzPackBytes(1000, 4) == kernels::QuantPackedBytes(1000, 4));
static_assert(QgzPackBytes(1000, 8) == kernels::QuantPackedBytes(1000, 8));
static_assert(QgzPackBytes(513, 4) == kernels::QuantPackedBytes(513, 4));
static_assert(kQwzBlockElements == kQuantBlock);

// Step 1's and step 3's transfers carry the caller's tag with the step in
// the top byte.
constexpr int kStepTagShift = 56;

float* ScalesOf(void* pack, int64_t n, int bits) {
  return reinterpret_cast<float*>(static_cast<char*>(pack) + kernels::QuantScalesOffset(n, bits));
}
const float* ScalesOf(const void* pack, int64_t n, int bits) {
  return reinterpret_cast<const float*>(static_cast<const char*>(pack) +
                                        kernels::QuantScalesOffset(n, bits));
}

// Block `b` (`len` fp32 values) into `pack`, a pack of n elements. Blocks
// begin at even elements (kQuantBlock is even), so an int4 block owns its
// bytes: the low nibble is written first, the high one or-ed in.
void QuantizeBlock(const float* block, int64_t b, int64_t len, int64_t n, int bits, void* pack) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < len; ++i) absmax = std::fmax(absmax, std::fabs(block[i]));
  const float scale = kernels::QuantScale(absmax, bits);
  ScalesOf(pack, n, bits)[b] = scale;
  uint8_t* values = static_cast<uint8_t*>(pack);
  const int64_t begin = b * kQuantBlock;
  if (bits == 8) {
    for (int64_t i = 0; i < len; ++i) {
      values[begin + i] =
          static_cast<uint8_t>(static_cast<int8_t>(kernels::QuantizeElement(block[i], scale, 8)));
    }
    return;
  }
  for (int64_t i = 0; i < len; ++i) {
    const uint8_t nibble = static_cast<uint8_t>(kernels::QuantizeElement(block[i], scale, 4) & 0xF);
    const int64_t e = begin + i;
    if ((e & 1) == 0) {
      values[e >> 1] = nibble;
    } else {
      values[e >> 1] = static_cast<uint8_t>(values[e >> 1] | (nibble << 4));
    }
  }
}

// The padding is part of what ranks exchange: never uninitialised bytes.
void ZeroPackPadding(int64_t n, int bits, void* pack) {
  char* p = static_cast<char*>(pack);
  const int64_t values = kernels::QuantValueBytes(n, bits);
  const int64_t scales = kernels::QuantScalesOffset(n, bits);
  std::memset(p + values, 0, scales - values);
  const int64_t scales_end = scales + kernels::QuantBlocks(n) * 4;
  std::memset(p + scales_end, 0, kernels::QuantPackedBytes(n, bits) - scales_end);
}

// block[i] = sum over packs of their dequantized block b, in pack order.
// Multiply and add apart: the file is built with -ffp-contract=off.
void SumBlock(const void* const* packs, int num, int64_t b, int64_t len, int64_t n, int bits,
              float* block) {
  const int64_t begin = b * kQuantBlock;
  for (int k = 0; k < num; ++k) {
    const uint8_t* values = static_cast<const uint8_t*>(packs[k]);
    const float scale = ScalesOf(packs[k], n, bits)[b];
    for (int64_t i = 0; i < len; ++i) {
      const float v = static_cast<float>(kernels::QuantValueAt(values, begin + i, bits)) * scale;
      block[i] = k == 0 ? v : block[i] + v;
    }
  }
}

}  // namespace

void QuantizePack(const void* x, int64_t n, DType dtype, int bits, void* pack) {
  float block[kQuantBlock];
  for (int64_t b = 0; b < kernels::QuantBlocks(n); ++b) {
    const int64_t len = std::min(kQuantBlock, n - b * kQuantBlock);
    WidenToFp32(x, b * kQuantBlock, len, dtype, block);
    QuantizeBlock(block, b, len, n, bits, pack);
  }
  ZeroPackPadding(n, bits, pack);
}

void RequantizeSum(const void* const* packs, int num, int64_t n, int bits, void* out) {
  float block[kQuantBlock];
  for (int64_t b = 0; b < kernels::QuantBlocks(n); ++b) {
    const int64_t len = std::min(kQuantBlock, n - b * kQuantBlock);
    SumBlock(packs, num, b, len, n, bits, block);
    QuantizeBlock(block, b, len, n, bits, out);
  }
  ZeroPackPadding(n, bits, out);
}

void DequantizeSum(const void* const* packs, int num, int64_t n, int bits, DType dtype, void* out) {
  float block[kQuantBlock];
  for (int64_t b = 0; b < kernels::QuantBlocks(n); ++b) {
    const int64_t len = std::min(kQuantBlock, n - b * kQuantBlock);
    SumBlock(packs, num, b, len, n, bits, block);
    NarrowFromFp32(block, b * kQuantBlock, len, dtype, out);
  }
}

int QgzRanksPerNode(const NodeLayout& layout) {
  const int world = static_cast<int>(layout.node_of_rank.size());
  const int per_node = layout.max_ranks_per_node();
  if (per_node <= 0 || world % per_node != 0) return world;
  for (int r = 0; r < world; ++r) {
    if (layout.node_of_rank[r] != r / per_node) return world;
  }
  return per_node;
}

int64_t QgzScratchBytes(int world, int64_t count, int bits) {
  return 2 * int64_t{world} * kernels::QuantPackedBytes(count, bits);
}

absl::Status QuantizedReduceScatter::Start(Communicator& comm, int ranks_per_node, int bits,
                                           const void* send, void* recv, int64_t count, DType dtype,
                                           uint64_t tag, char* scratch) {
  const int world = comm.size();
  if (ranks_per_node < 1 || world % ranks_per_node != 0 || (bits != 4 && bits != 8) || count < 0 ||
      (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && dtype != DType::kFloat16)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "quantized reduce-scatter: %d ranks per node of %d, %d bits, %d elements of %s: need "
        "ranks per node dividing the group, 4 or 8 bits and fp32, bf16 or fp16",
        ranks_per_node, world, bits, count, DTypeName(dtype)));
  }
  comm_ = &comm;
  bits_ = bits;
  ranks_per_node_ = ranks_per_node;
  nodes_ = world / ranks_per_node;
  node_ = comm.rank() / ranks_per_node;
  slot_ = comm.rank() % ranks_per_node;
  recv_ = recv;
  count_ = count;
  dtype_ = dtype;
  tag_ = tag & ((uint64_t{1} << kStepTagShift) - 1);
  pack_bytes_ = kernels::QuantPackedBytes(count, bits);
  send_packs_ = scratch;
  recv_packs_ = scratch + int64_t{world} * pack_bytes_;
  pending_.clear();

  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  const char* data = static_cast<const char*>(send);
  // Pack [j][m] is block m * R + j: the blocks of slot j's ranks, node order.
  // One node per rank: straight to step 3's sends ([0][m] = block m).
  for (int j = 0; j < ranks_per_node_; ++j) {
    for (int m = 0; m < nodes_; ++m) {
      const int64_t index = int64_t{j} * nodes_ + m;
      char* pack = j == slot_ && ranks_per_node_ > 1 ? PackAt(recv_packs_, index)
                                                     : PackAt(send_packs_, index);
      QuantizePack(data + (int64_t{m} * ranks_per_node_ + j) * count * elem, count, dtype, bits,
                   pack);
    }
  }
  if (ranks_per_node_ == 1) {
    IssueAcrossNodes();
    return absl::OkStatus();
  }
  step_ = kWithinNode;
  const uint64_t step_tag = tag_ | (uint64_t{1} << kStepTagShift);
  const int64_t bytes = int64_t{nodes_} * pack_bytes_;
  for (int j = 0; j < ranks_per_node_; ++j) {
    if (j == slot_) continue;
    const int peer = node_ * ranks_per_node_ + j;
    const int64_t at = int64_t{j} * nodes_;
    pending_.push_back(comm.Recv(PackAt(recv_packs_, at), bytes, DType::kUInt8, peer, step_tag));
    pending_.push_back(comm.Send(PackAt(send_packs_, at), bytes, DType::kUInt8, peer, step_tag));
  }
  return absl::OkStatus();
}

absl::Status QuantizedReduceScatter::WaitPending() {
  absl::Status first;
  for (CommHandle& h : pending_) first.Update(h.Wait());
  pending_.clear();
  return first;
}

void QuantizedReduceScatter::IssueAcrossNodes() {
  step_ = kAcrossNodes;
  const uint64_t step_tag = tag_ | (uint64_t{2} << kStepTagShift);
  for (int m = 0; m < nodes_; ++m) {
    if (m == node_) continue;
    const int peer = m * ranks_per_node_ + slot_;
    pending_.push_back(
        comm_->Recv(PackAt(recv_packs_, m), pack_bytes_, DType::kUInt8, peer, step_tag));
    pending_.push_back(
        comm_->Send(PackAt(send_packs_, m), pack_bytes_, DType::kUInt8, peer, step_tag));
  }
}

void QuantizedReduceScatter::FinishAcrossNodes() {
  std::vector<const void*> packs(nodes_);
  for (int m = 0; m < nodes_; ++m) {
    packs[m] = m == node_ ? PackAt(send_packs_, m) : PackAt(recv_packs_, m);
  }
  DequantizeSum(packs.data(), nodes_, count_, bits_, dtype_, recv_);
  step_ = kDone;
}

absl::Status QuantizedReduceScatter::Advance() {
  ZS_RETURN_IF_ERROR(WaitPending());
  switch (step_) {
    case kWithinNode: {
      // Every slot's pack of each node's block for this slot, slot order.
      std::vector<const void*> packs(ranks_per_node_);
      for (int m = 0; m < nodes_; ++m) {
        for (int j = 0; j < ranks_per_node_; ++j) {
          packs[j] = PackAt(recv_packs_, int64_t{j} * nodes_ + m);
        }
        if (nodes_ == 1) {
          DequantizeSum(packs.data(), ranks_per_node_, count_, bits_, dtype_, recv_);
          step_ = kDone;
          return absl::OkStatus();
        }
        // Step 1's sends have completed: their memory takes step 3's.
        RequantizeSum(packs.data(), ranks_per_node_, count_, bits_, PackAt(send_packs_, m));
      }
      IssueAcrossNodes();
      return absl::OkStatus();
    }
    case kAcrossNodes:
      FinishAcrossNodes();
      return absl::OkStatus();
    default:
      return absl::FailedPreconditionError("quantized reduce-scatter: Advance with nothing to do");
  }
}

QuantizedReduceWorker::~QuantizedReduceWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

CommHandle QuantizedReduceWorker::Submit(std::unique_ptr<QuantizedReduceScatter> op) {
  auto state = std::make_shared<CommOpState>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({std::move(op), state});
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }
  cv_.notify_all();
  return CommHandle(state);
}

void QuantizedReduceWorker::Run() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    // Advance waits for every transfer of a step, failed or not, before it
    // returns, so nothing touches the scratch once the handle completes.
    absl::Status status;
    while (status.ok() && !job.op->done()) status = job.op->Advance();
    job.state->Complete(std::move(status));
  }
}

}  // namespace zeroshard::internal
