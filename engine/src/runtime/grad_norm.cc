#include "engine/src/runtime/grad_norm.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {

// The planner sizes norm_blocks with the layout's block size; the kernels sum
// blocks of their own. They must be the same number.
static_assert(static_cast<int64_t>(kernels::kNormBlock) == kNormBlockElements,
              "kernels::kNormBlock must equal the layout's kNormBlockElements");

GradNorm::GradNorm(const FlatLayout& layout, int rank, DType grad_dtype, bool host_accessible,
                   const ShardBuffers& buffers, RuntimeServices& services)
    : layout_(layout),
      rank_(rank),
      grad_dtype_(grad_dtype),
      host_accessible_(host_accessible),
      buffers_(buffers),
      services_(services) {
  for (int u = 0; u < layout_.num_units(); ++u) trainable_segments_ += layout_.unit(u).trainable;
}

void GradNorm::SetModelParallel(const ModelSpec& model, const ModelParallelOptions& parallel) {
  model_parallel_ = parallel.group;
  norm_ranges_.assign(layout_.num_units(), {});
  if (parallel.count_replicated) return;
  auto spec_of = [&](const ParamSlot& slot) -> const ParamSpec& {
    return model.units[slot.spec_unit].params[slot.spec_param];
  };
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitSegment& seg = layout_.unit(u);
    if (!seg.trainable) continue;
    bool any_replicated = false;
    for (const ParamSlot& slot : seg.params) any_replicated |= spec_of(slot).tp_split_dim < 0;
    if (!any_replicated) continue;
    // Runs of params alike (counted or replicated), each param taken with
    // the alignment gap after it (zero padding, so its squares are moot):
    // the runs then start at param offsets, multiples of 64, so no norm
    // block holds two runs of one kind and the blocks buffer suffices.
    std::vector<NormRange>& runs = norm_ranges_[u];
    for (size_t p = 0; p < seg.params.size(); ++p) {
      const bool counted = spec_of(seg.params[p]).tp_split_dim >= 0;
      const int64_t begin = p == 0 ? 0 : seg.params[p].offset;
      const int64_t end = p + 1 < seg.params.size() ? seg.params[p + 1].offset : seg.padded_numel;
      if (!runs.empty() && runs.back().counted == counted) {
        runs.back().range.end = end;
      } else {
        runs.push_back({{begin, end}, counted});
      }
    }
  }
}

absl::Status GradNorm::OnGradFinal(int u) {
  ++units_final_;
  if (!EarlyNorm()) return absl::OkStatus();
  // Each unit's shard is a whole number of norm blocks and its blocks have
  // their own place in norm_blocks (which holds the whole shard's), so the
  // units' sums can be enqueued at any time and in any order; the exact
  // accumulator makes their sum independent of that order.
  const UnitSegment& seg = layout_.unit(u);
  const ElementRange shard = layout_.ShardRange(u, rank_);
  return services_.ops().BlockSumSquares(
      buffers_.GradsAt(u, shard.begin), seg.shard_numel, grad_dtype_,
      buffers_.norm_blocks.as<double>() + seg.train_shard_offset / kNormBlockElements);
}

absl::StatusOr<const double*> GradNorm::BlocksOnHost(int64_t blocks) {
  const double* on_device = buffers_.norm_blocks.as<double>();
  const double* host = on_device;
  if (!host_accessible_) {
    host_blocks_.resize(std::max(
        host_blocks_.size(), static_cast<size_t>(buffers_.norm_blocks.bytes()) / sizeof(double)));
    ZS_RETURN_IF_ERROR(services_.CopyOnCompute(host_blocks_.data(), on_device,
                                               blocks * static_cast<int64_t>(sizeof(double))));
    host = host_blocks_.data();
  }
  ZS_RETURN_IF_ERROR(services_.SyncCompute());
  return host;
}

absl::StatusOr<kernels::ExactSum> GradNorm::LocalSum() {
  kernels::ExactSum sum;
  if (EarlyNorm()) {
    // Every unit's block sums were enqueued as its gradient became final
    // (the hook, once per unit and step); one wait and one exact sum over
    // every block.
    if (units_final_ != trainable_segments_) {
      return absl::InternalError(
          absl::StrFormat("the gradient norm: %d of %d segments' gradients were final",
                          units_final_, trainable_segments_));
    }
    const int64_t blocks = layout_.train_shard_numel() / kNormBlockElements;
    ZS_ASSIGN_OR_RETURN(const double* host, BlocksOnHost(blocks));
    sum.AddBlocks(host, static_cast<size_t>(blocks));
  } else {
    for (int u = 0; u < layout_.num_units(); ++u) {
      if (layout_.unit(u).trainable) ZS_RETURN_IF_ERROR(AddShardSquares(u, sum));
    }
  }
  sum.Normalize();
  return sum;
}

absl::Status GradNorm::AddShardSquares(int u, kernels::ExactSum& sum) {
  const ElementRange shard = layout_.ShardRange(u, rank_);
  // The pieces of the shard: all of it, or (a unit with replicated params
  // this rank does not count) its intersection with each run, cut where the
  // segment's norm blocks begin, so that every block sum covers part of one
  // fixed block and the norm does not depend on dp.
  std::vector<ElementRange> counted;
  std::vector<ElementRange> ignored;
  if (norm_ranges_[u].empty()) {
    counted.push_back(shard);
  } else {
    for (const NormRange& run : norm_ranges_[u]) {
      const int64_t begin = std::max(run.range.begin, shard.begin);
      const int64_t end = std::min(run.range.end, shard.end);
      if (begin >= end) continue;
      std::vector<ElementRange>& pieces = run.counted ? counted : ignored;
      const int64_t aligned =
          std::min(end, (begin + kNormBlockElements - 1) / kNormBlockElements * kNormBlockElements);
      if (aligned > begin) pieces.push_back({begin, aligned});
      if (end > aligned) pieces.push_back({aligned, end});
    }
  }
  double* blocks = buffers_.norm_blocks.as<double>();
  const int64_t capacity = buffers_.norm_blocks.bytes() / static_cast<int64_t>(sizeof(double));
  // Block sums of `pieces` into `target`, flushed (copied to the host and
  // added exactly) whenever the blocks buffer is full and at the end.
  auto add_pieces = [&](const std::vector<ElementRange>& pieces,
                        kernels::ExactSum& target) -> absl::Status {
    int64_t used = 0;
    auto flush = [&]() -> absl::Status {
      ZS_ASSIGN_OR_RETURN(const double* host, BlocksOnHost(used));
      target.AddBlocks(host, static_cast<size_t>(used));
      used = 0;
      return absl::OkStatus();
    };
    for (const ElementRange& piece : pieces) {
      const int64_t n = piece.size();
      const int64_t num_blocks = (n + kNormBlockElements - 1) / kNormBlockElements;
      if (used > 0 && used + num_blocks > capacity) ZS_RETURN_IF_ERROR(flush());
      ZS_RETURN_IF_ERROR(services_.ops().BlockSumSquares(buffers_.GradsAt(u, piece.begin), n,
                                                         grad_dtype_, blocks + used));
      used += num_blocks;
    }
    // Also with no blocks: the single-piece path always synced here.
    return flush();
  };
  ZS_RETURN_IF_ERROR(add_pieces(counted, sum));
  if (!ignored.empty()) {
    // A replicated param's gradient that is not finite here must skip the
    // step as surely as one in a counted param: its count joins the sum's.
    kernels::ExactSum replicated;
    ZS_RETURN_IF_ERROR(add_pieces(ignored, replicated));
    sum.limbs()[kernels::ExactSum::kValueLimbs] += replicated.non_finite();
  }
  return absl::OkStatus();
}

absl::Status GradNorm::AddModelParallel(kernels::ExactSum& total) {
  if (model_parallel_ == nullptr) return absl::OkStatus();
  // The other tp/pp shards' sums, as integers again, so the norm is exact
  // and the same on every rank of the group; the non-finite count travels
  // in the last limb, so every shard also skips the same steps. Normalized
  // first: each limb then stays below world x 2^32, far from overflow.
  total.Normalize();
  CommHandle handle = model_parallel_->AllReduce(total.limbs(), total.limbs(),
                                                 kernels::ExactSum::kLimbs, DType::kInt64);
  return services_.WaitComm(handle, WaitSite::kModelParallel);
}

}  // namespace zeroshard::internal
