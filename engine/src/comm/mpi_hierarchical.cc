// The `mpi` backend's hierarchical collectives: the same bits as the flat
// ReduceScatterBlocks and AllGatherBlocks (mpi_communicator.cc), fewer bytes
// across nodes (mpi_communicator.h says how they run; docs/multinode.md
// counts the bytes).
//
// Why a chain and not a tree: the flat reduce-scatter adds rank 0's block,
// then rank 1's, and so on, and floating-point sums depend on that order.
// With each node's ranks consecutive, the sum in rank order is node 0's
// ranks, then node 1's, ...: a partial sum that visits the nodes in order
// and is kept unrounded (AccumulatorDType) between them gives the same bits.
// A tree (each node summing its own ranks, then the nodes' sums added) would
// not.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/src/comm/mpi_communicator.h"
#include "engine/src/comm/reduce.h"
#include "zeroshard/communicator.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace internal {
namespace {

// Elements of a block per pipeline chunk, in bytes of the accumulator: small
// enough that the nodes of the chain work on different chunks at once,
// large enough that a message's fixed cost does not matter.
constexpr int64_t kChainChunkBytes = int64_t{1} << 20;

}  // namespace

void MpiCommunicator::PlanHierarchy() {
  const NodeLayout layout = node_layout();
  Hierarchy& h = hierarchy_;
  h.node_of = layout.node_of_rank;
  h.ranks_on.assign(layout.num_nodes(), {});
  h.local_index.assign(size(), 0);
  bool consecutive = true;
  for (int r = 0; r < size(); ++r) {
    std::vector<int>& ranks = h.ranks_on[h.node_of[r]];
    h.local_index[r] = static_cast<int>(ranks.size());
    ranks.push_back(r);
    // Nodes are numbered in the order of their lowest rank, so the ranks
    // are consecutive per node exactly when the numbers never go down.
    if (r > 0 && h.node_of[r] < h.node_of[r - 1]) consecutive = false;
  }
  const CollectiveTopology topology = options().topology;
  h.enabled = false;
  if (topology == CollectiveTopology::kFlat) {
    h.path = "flat: CommOptions::topology is flat";
  } else if (layout.num_nodes() == 1) {
    h.path = "flat: one node";
  } else if (!consecutive) {
    h.path = absl::StrFormat(
        "flat: the nodes' ranks are not consecutive (%s), so a chain over the nodes would not "
        "add in rank order; place ranks by node (mpirun --map-by node:... or --map-by slot) for "
        "the hierarchical path",
        layout.Describe());
  } else if (topology == CollectiveTopology::kAuto && layout.max_ranks_per_node() == 1) {
    h.path = "flat: one rank per node (nothing to gather within a node)";
  } else {
    h.enabled = true;
    h.path = absl::StrFormat("hierarchical: %s", layout.Describe());
  }
}

bool MpiCommunicator::ChainPays(DType dtype, const std::vector<int64_t>& lengths) const {
  if (options().topology == CollectiveTopology::kHierarchical) return true;
  const Hierarchy& h = hierarchy_;
  const int world = size();
  const int nodes = static_cast<int>(h.ranks_on.size());
  const int64_t element_bytes = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t acc_bytes = static_cast<int64_t>(DTypeSize(AccumulatorDType(dtype)));
  // Bytes across nodes, summed over the group. Flat: each block from every
  // rank off its owner's node. Chain: a partial sum per node boundary, then
  // the result to an owner off the last node.
  int64_t flat = 0;
  int64_t chain = 0;
  for (int block = 0; block < world; ++block) {
    const int owner_node = h.node_of[block];
    const int64_t off_node = world - static_cast<int64_t>(h.ranks_on[owner_node].size());
    flat += lengths[block] * element_bytes * off_node;
    chain +=
        lengths[block] * ((nodes - 1) * acc_bytes + (owner_node != nodes - 1 ? element_bytes : 0));
  }
  return chain < flat;
}

absl::Status MpiCommunicator::HierarchicalReduceScatter(const CollectiveArgs& args,
                                                        const char* send,
                                                        const std::vector<int64_t>& offsets,
                                                        const std::vector<int64_t>& lengths,
                                                        char* out, absl::Time deadline) {
  const Hierarchy& h = hierarchy_;
  const int world = size();
  const int me = rank();
  const int node = h.node_of[me];
  const int last_node = static_cast<int>(h.ranks_on.size()) - 1;
  const std::vector<int>& mates = h.ranks_on[node];
  const int node_size = static_cast<int>(mates.size());
  const DType acc_dtype = AccumulatorDType(args.dtype);
  const int64_t element_bytes = static_cast<int64_t>(DTypeSize(args.dtype));
  const int64_t acc_bytes = static_cast<int64_t>(DTypeSize(acc_dtype));
  const int64_t chunk = std::max<int64_t>(1, kChainChunkBytes / acc_bytes);
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const int64_t slot_elements = std::min(chunk, longest);
  const int tag = Tag(args);
  auto chunk_of = [&](int block, int64_t begin) {
    return std::max<int64_t>(0, std::min(chunk, lengths[block] - begin));
  };

  // The blocks this rank carries along the chain, and per carried block
  // room for its node mates' chunks, the partial sum from the node before
  // and the one it passes on (or the rounded result).
  std::vector<int> carried;
  for (int block = 0; block < world; ++block) {
    if (h.SlotRank(node, block) == me) carried.push_back(block);
  }
  const int64_t inputs_bytes = static_cast<int64_t>(node_size - 1) * slot_elements * element_bytes;
  const int64_t per_block = inputs_bytes + 2 * slot_elements * acc_bytes;
  const size_t scratch_bytes = carried.size() * static_cast<size_t>(per_block);
  if (scratch_.size() < scratch_bytes) scratch_.resize(scratch_bytes);
  auto mate_input = [&](size_t i, int mate_position) {
    // mate_position counts the node's ranks without this one.
    return scratch_.data() + i * per_block + mate_position * slot_elements * element_bytes;
  };
  auto partial_in = [&](size_t i) { return scratch_.data() + i * per_block + inputs_bytes; };
  auto partial_out = [&](size_t i) { return partial_in(i) + slot_elements * acc_bytes; };

  // This rank's own block, from the last node's carrier: completed after
  // the loop, so that a node early in the chain goes on to the next chunk.
  Requests finals;
  auto fail = [&](Requests& open, absl::Status status) {
    Abandon(open);
    Abandon(finals);
    return status;
  };
  std::vector<const void*> inputs(node_size);
  for (int64_t begin = 0; begin < longest; begin += chunk) {
    // Round 1: the node's chunks of the carried blocks, the partial sums
    // from the node before; this rank's chunks to their carriers.
    Requests gather;
    absl::Status posted;
    for (size_t i = 0; i < carried.size() && posted.ok(); ++i) {
      const int block = carried[i];
      const int64_t n = chunk_of(block, begin);
      if (n == 0) continue;
      int position = 0;
      for (int mate : mates) {
        if (mate == me) continue;
        posted = PostRecv(gather, mate_input(i, position++), n * element_bytes, mate, tag, args);
        if (!posted.ok()) break;
      }
      if (posted.ok() && node > 0) {
        posted =
            PostRecv(gather, partial_in(i), n * acc_bytes, h.SlotRank(node - 1, block), tag, args);
      }
    }
    for (int block = 0; block < world && posted.ok(); ++block) {
      const int64_t n = chunk_of(block, begin);
      const int carrier = h.SlotRank(node, block);
      if (n == 0 || carrier == me) continue;
      posted = PostSend(gather, send + (offsets[block] + begin) * element_bytes, n * element_bytes,
                        carrier, tag, args);
    }
    if (!posted.ok()) return fail(gather, posted);
    absl::Status done = Complete(gather, args, deadline, Phase::kData);
    if (!done.ok()) return fail(gather, done);

    // Add this node's ranks in rank order onto the partial sum; pass it on
    // along the chain, or round it and send it to the block's owner.
    Requests pass;
    for (size_t i = 0; i < carried.size() && posted.ok(); ++i) {
      const int block = carried[i];
      const int64_t n = chunk_of(block, begin);
      if (n == 0) continue;
      int position = 0;
      for (int k = 0; k < node_size; ++k) {
        inputs[k] = mates[k] == me ? send + (offsets[block] + begin) * element_bytes
                                   : mate_input(i, position++);
      }
      const void* partial = node > 0 ? partial_in(i) : nullptr;
      if (node < last_node) {
        ContinueSumInRankOrder(partial, inputs.data(), node_size, partial_out(i), n, args.dtype,
                               /*finish=*/false);
        posted =
            PostSend(pass, partial_out(i), n * acc_bytes, h.SlotRank(node + 1, block), tag, args);
      } else {
        // Our own block may be `out` itself (in place): the sum reads each
        // piece of its inputs before it writes that piece.
        char* result = block == me ? out + begin * element_bytes : partial_out(i);
        ContinueSumInRankOrder(partial, inputs.data(), node_size, result, n, args.dtype,
                               /*finish=*/true);
        if (block != me) posted = PostSend(pass, result, n * element_bytes, block, tag, args);
      }
    }
    const int64_t mine = chunk_of(me, begin);
    const int my_last_carrier = h.SlotRank(last_node, me);
    if (posted.ok() && mine > 0 && my_last_carrier != me) {
      posted = PostRecv(finals, out + begin * element_bytes, mine * element_bytes, my_last_carrier,
                        tag, args);
    }
    if (!posted.ok()) return fail(pass, posted);
    done = Complete(pass, args, deadline, Phase::kData);
    if (!done.ok()) return fail(pass, done);
  }
  return Complete(finals, args, deadline, Phase::kData);
}

absl::Status MpiCommunicator::HierarchicalAllGather(const CollectiveArgs& args, const char* mine,
                                                    char* recv, const std::vector<int64_t>& offsets,
                                                    const std::vector<int64_t>& lengths,
                                                    absl::Time deadline) {
  const Hierarchy& h = hierarchy_;
  const int world = size();
  const int me = rank();
  const int node = h.node_of[me];
  const std::vector<int>& mates = h.ranks_on[node];
  const int64_t element_bytes = static_cast<int64_t>(DTypeSize(args.dtype));
  const int tag = Tag(args);
  auto block_at = [&](int source) { return recv + offsets[source] * element_bytes; };
  auto block_bytes = [&](int source) { return lengths[source] * element_bytes; };

  // Round 1: every node mate's block, and the blocks of this rank's slot on
  // the other nodes, straight from their owners; this rank's block to its
  // node mates and to its slot's rank on every other node.
  Requests direct;
  absl::Status posted;
  for (int source = 0; source < world && posted.ok(); ++source) {
    if (source == me || lengths[source] == 0) continue;
    if (h.node_of[source] == node || h.SlotRank(node, h.local_index[source]) == me) {
      posted = PostRecv(direct, block_at(source), block_bytes(source), source, tag, args);
    }
  }
  if (lengths[me] > 0) {
    for (int mate : mates) {
      if (mate == me || !posted.ok()) continue;
      posted = PostSend(direct, mine, block_bytes(me), mate, tag, args);
    }
    for (int other = 0; other < static_cast<int>(h.ranks_on.size()) && posted.ok(); ++other) {
      if (other == node) continue;
      posted =
          PostSend(direct, mine, block_bytes(me), h.SlotRank(other, h.local_index[me]), tag, args);
    }
    char* own = block_at(me);
    if (own != mine) std::memcpy(own, mine, block_bytes(me));
  }
  if (!posted.ok()) {
    Abandon(direct);
    return posted;
  }
  ZS_RETURN_IF_ERROR(Complete(direct, args, deadline, Phase::kData));

  // Round 2: the blocks that entered the node through this rank go on to
  // its node mates; the others come from the node mate they entered by.
  Requests within;
  for (int source = 0; source < world && posted.ok(); ++source) {
    if (h.node_of[source] == node || lengths[source] == 0) continue;
    const int entry = h.SlotRank(node, h.local_index[source]);
    if (entry != me) {
      posted = PostRecv(within, block_at(source), block_bytes(source), entry, tag, args);
      continue;
    }
    for (int mate : mates) {
      if (mate == me || !posted.ok()) continue;
      posted = PostSend(within, block_at(source), block_bytes(source), mate, tag, args);
    }
  }
  if (!posted.ok()) {
    Abandon(within);
    return posted;
  }
  return Complete(within, args, deadline, Phase::kData);
}

}  // namespace internal
}  // namespace zeroshard
