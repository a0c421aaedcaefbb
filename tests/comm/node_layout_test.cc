// NodeLayout: the node of each rank as a communicator reports it, and its
// description, against a reference built the plain way on random layouts.
#include <unistd.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_seed.h"
#include "zeroshard/communicator.h"

namespace zeroshard {
namespace {

// A random layout: nodes numbered by their lowest rank, as backends report.
NodeLayout RandomLayout(std::mt19937_64& rng) {
  const int ranks = 1 + static_cast<int>(rng() % 12);
  const int nodes = 1 + static_cast<int>(rng() % ranks);
  std::vector<int> raw(ranks);
  for (int r = 0; r < ranks; ++r) raw[r] = static_cast<int>(rng() % nodes);
  NodeLayout layout;
  std::map<int, int> number;  // raw id -> node index by first appearance
  for (int r = 0; r < ranks; ++r) {
    auto [it, added] = number.emplace(raw[r], static_cast<int>(number.size()));
    if (added) layout.node_names.push_back(absl::StrCat("host", raw[r]));
    layout.node_of_rank.push_back(it->second);
  }
  layout.source = "test";
  return layout;
}

TEST(NodeLayoutTest, RanksPerNodeAndTheDescriptionAgreeWithAPlainCount) {
  std::mt19937_64 rng(testing::Seed());
  for (int trial = 0; trial < 500; ++trial) {
    const NodeLayout layout = RandomLayout(rng);
    const int ranks = static_cast<int>(layout.node_of_rank.size());
    std::vector<int> count(layout.num_nodes(), 0);
    for (int node : layout.node_of_rank) ++count[node];
    int most = 0, fewest = ranks;
    std::set<int> seen;
    for (int n = 0; n < layout.num_nodes(); ++n) {
      const std::vector<int> on = layout.RanksOn(n);
      ASSERT_EQ(static_cast<int>(on.size()), count[n]) << testing::SeedTrace();
      for (int r : on) {
        EXPECT_EQ(layout.node_of_rank[r], n);
        EXPECT_TRUE(seen.insert(r).second) << "rank " << r << " on two nodes";
      }
      most = std::max(most, count[n]);
      fewest = std::min(fewest, count[n]);
    }
    EXPECT_EQ(static_cast<int>(seen.size()), ranks);
    EXPECT_EQ(layout.max_ranks_per_node(), most);
    // The description names every node with each of its ranks.
    const std::string text = layout.Describe();
    const std::string head =
        fewest == most
            ? absl::StrCat(layout.num_nodes(), layout.num_nodes() == 1 ? " node x " : " nodes x ",
                           most, most == 1 ? " rank" : " ranks")
            : absl::StrCat(layout.num_nodes(), " nodes, ", fewest, "-", most, " ranks each");
    EXPECT_EQ(text.rfind(head + " (test):", 0), 0u) << text << " " << testing::SeedTrace();
    for (int n = 0; n < layout.num_nodes(); ++n) {
      EXPECT_NE(text.find(layout.node_names[n] + " rank"), std::string::npos) << text;
    }
  }
}

TEST(NodeLayoutTest, RunsOfConsecutiveRanksAreShortened) {
  NodeLayout layout;
  layout.node_of_rank = {0, 0, 1, 1, 0, 2, 1};
  layout.node_names = {"a", "b", "c"};
  layout.source = "hand";
  EXPECT_EQ(layout.Describe(),
            "3 nodes, 1-3 ranks each (hand): a ranks 0-1,4; b ranks 2-3,6; c rank 5");
  layout.node_of_rank = {0, 0, 1, 1};
  layout.node_names = {"zsc-node0", "zsc-node1"};
  layout.source = "MPI_COMM_TYPE_SHARED";
  EXPECT_EQ(layout.Describe(),
            "2 nodes x 2 ranks (MPI_COMM_TYPE_SHARED): zsc-node0 ranks 0-1; zsc-node1 ranks 2-3");
}

TEST(NodeLayoutTest, LocalRanksAreOneNodeNamedByThisHost) {
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const absl::Status status = RunLocalRanks(3, [&](int rank, Communicator& comm) {
    const NodeLayout layout = comm.node_layout();
    EXPECT_EQ(layout.node_of_rank, std::vector<int>({0, 0, 0}));
    EXPECT_EQ(layout.node_names, std::vector<std::string>({host}));
    EXPECT_EQ(layout.Describe(),
              absl::StrCat("1 node x 3 ranks (in-process ranks: one node): ", host, " ranks 0-2"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace zeroshard
