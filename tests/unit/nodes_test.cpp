// Several nodes over loopback, each a Nodes object on threads of this test (what separate hosts'
// processes do over TCP): the store's rendezvous and agreements, a flag mismatch named, groups
// whose ranks live on several nodes giving the bits of one process's group (all-reduce in rank
// order, all-gather in rank order), a stage link across nodes, and a failed node ending the
// others' collectives with an error instead of a hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <thread>

#include "common/compare.h"
#include "common/nodes_util.h"
#include "common/test_util.h"
#include "core/error.h"
#include "dist/comm_group.h"
#include "dist/communicator.h"
#include "dist/nodes.h"
#include "dist/stage_link.h"

namespace atom::test {
namespace {

TEST(Nodes, PlacementPutsTheLeaderOnNodeZero) {
  // 4 ranks on 2 nodes, leader rank 0 (pp 1): ranks 0,1 on node 0.
  EXPECT_EQ(node_of_rank(0, 4, 2, 0), 0);
  EXPECT_EQ(node_of_rank(1, 4, 2, 0), 0);
  EXPECT_EQ(node_of_rank(2, 4, 2, 0), 1);
  // pp 2 x tp 2, leader rank 2 (the last stage's first): the last stage on node 0.
  EXPECT_EQ(node_of_rank(2, 4, 2, 2), 0);
  EXPECT_EQ(node_of_rank(3, 4, 2, 2), 0);
  EXPECT_EQ(node_of_rank(0, 4, 2, 2), 1);
  // pp 3 x tp 2 over 3 nodes, leader rank 4.
  EXPECT_EQ(node_of_rank(4, 6, 3, 4), 0);
  EXPECT_EQ(node_of_rank(0, 6, 3, 4), 1);
  EXPECT_EQ(node_of_rank(2, 6, 3, 4), 2);
  EXPECT_ERROR_CONTAINS(node_of_rank(0, 3, 2, 0), "3 ranks over 2 nodes");
}

TEST(Nodes, AgreeOverTheStoreAndNameAFlagMismatch) {
  std::vector<int64_t> mins(3), maxs(3);
  std::vector<std::string> errors(3);
  on_nodes(3, [&](Nodes& nodes) {
    const auto k = static_cast<size_t>(nodes.rank());
    mins[k] = nodes.min_over_nodes("pages", 100 - 10 * nodes.rank());
    maxs[k] = nodes.max_over_nodes("pages", 7 + nodes.rank());
    nodes.check_same("flags", "tp 2");
    try {
      nodes.check_same("flags", nodes.rank() == 2 ? "tp 4" : "tp 2");
    } catch (const Error& e) {
      errors[k] = e.what();
    }
    const int64_t c = nodes.store().add("counter", 1);  // each node's add is counted once
    EXPECT_GE(c, 1);
    EXPECT_LE(c, 3);
  });
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(mins[k], 80);
    EXPECT_EQ(maxs[k], 9);
    EXPECT_NE(errors[k].find("node 2 was started with other flags than node 0: 'tp 4'"),
              std::string::npos)
        << errors[k];
  }
}

TEST(Nodes, JoiningWithBadFlagsIsNamed) {
  NodeOptions o;
  o.nnodes = 2;
  o.node_rank = 2;
  EXPECT_ERROR_CONTAINS(Nodes{o}, "--node-rank 2 is outside [0, 2)");
  o.node_rank = 0;
  o.master_port = 70000;
  EXPECT_ERROR_CONTAINS(Nodes{o}, "--master-port 70000");
  o.master_port = free_port();
  o.node_rank = 1;
  o.timeout_s = 0.3;  // nobody serves the store
  EXPECT_ERROR_CONTAINS(Nodes{o}, "cannot connect to 127.0.0.1");
}

// Each rank's contribution: distinct values per rank and element, so a wrong order shows.
Tensor contribution(int rank, int64_t n) {
  Tensor t = Tensor::empty({2, n}, DType::kF32);
  for (int64_t i = 0; i < 2 * n; ++i)
    t.ptr<float>()[i] = 0.1f * static_cast<float>(rank + 1) + 1e-3f * static_cast<float>(i) +
                        (rank == 2 ? 1e7f : 0.0f);  // a large term: summation order matters
  return t;
}

// all_reduce and all_gather results of every rank of a `size` group run on one LocalGroup.
void reference(int size, int64_t n, std::vector<Tensor>& sums, std::vector<Tensor>& gathers) {
  LocalGroup g(size);
  std::vector<std::thread> threads;
  sums.assign(static_cast<size_t>(size), Tensor());
  gathers.assign(static_cast<size_t>(size), Tensor());
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      auto c = g.communicator(r);
      Tensor x = contribution(r, n);
      c->all_reduce_sum(x);
      Tensor out = Tensor::empty({2, n * size}, DType::kF32);
      c->all_gather_last_dim(contribution(r, n), out);
      sums[static_cast<size_t>(r)] = x;
      gathers[static_cast<size_t>(r)] = out;
    });
  for (auto& t : threads) t.join();
}

TEST(Nodes, GroupsAcrossNodesGiveOneProcesssBits) {
  // 4 ranks: in blocks (0,0,1,1), interleaved (0,1,0,1), and 3 nodes (0,1,1,2); a large tensor
  // (8 MB a rank) that fills the sockets' buffers while both nodes send at once.
  for (const auto& c :
       std::vector<std::pair<std::vector<int>, int64_t>>{{{0, 0, 1, 1}, 5},
                                                         {{0, 1, 0, 1}, 7},
                                                         {{0, 1, 1, 2}, 3},
                                                         {{0, 0, 1, 1}, int64_t{1} << 20}}) {
    // Not structured bindings: clang 14 (the sanitizer build) cannot capture those in lambdas.
    const std::vector<int>& node_of = c.first;
    const int64_t n = c.second;
    std::vector<Tensor> want_sum, want_gather;
    reference(4, n, want_sum, want_gather);
    const int nnodes = *std::max_element(node_of.begin(), node_of.end()) + 1;
    std::vector<Tensor> sums(4), gathers(4);
    on_nodes(nnodes, [&](Nodes& nodes) {
      auto group = comm_group_create(nodes, "g", Device::cpu(), node_of);
      std::vector<std::thread> ranks;
      for (int r = 0; r < 4; ++r) {
        if (node_of[static_cast<size_t>(r)] != nodes.rank()) continue;
        ranks.emplace_back([&, r] {
          Communicator& c = group->communicator(r);
          EXPECT_EQ(c.rank(), r);
          EXPECT_EQ(c.size(), 4);
          Tensor x = contribution(r, n);
          c.all_reduce_sum(x);
          Tensor out = Tensor::empty({2, n * 4}, DType::kF32);
          c.all_gather_last_dim(contribution(r, n), out);
          sums[static_cast<size_t>(r)] = x;
          gathers[static_cast<size_t>(r)] = out;
        });
      }
      for (auto& t : ranks) t.join();
      EXPECT_ERROR_CONTAINS(group->communicator(node_of[0] == nodes.rank() ? 3 : 0),
                            "lives on node");
    });
    for (size_t r = 0; r < 4; ++r) {
      EXPECT_EQ(max_abs_diff(sums[r], want_sum[r]), 0.0f) << "rank " << r << " n " << n;
      EXPECT_EQ(max_abs_diff(gathers[r], want_gather[r]), 0.0f) << "rank " << r << " n " << n;
    }
  }
}

TEST(Nodes, StageLinkAcrossNodesKeepsOrderAndTensors) {
  on_nodes(2, [&](Nodes& nodes) {
    StageLink link;
    if (nodes.rank() == 0) {
      link.to_socket(nodes.connect("link", 1));
      for (int i = 0; i < 3; ++i) link.send({contribution(i, 4), Tensor()});
    } else {
      link.from_socket(nodes.connect("link", 0));
      for (int i = 0; i < 3; ++i) {
        const std::vector<Tensor> got = link.recv();
        ASSERT_EQ(got.size(), 2u);
        EXPECT_EQ(max_abs_diff(got[0], contribution(i, 4)), 0.0f);
        EXPECT_FALSE(got[1].defined());
      }
    }
  });
}

TEST(Nodes, AFailedNodeEndsTheOthersCollectives) {
  std::string error;
  on_nodes(2, [&](Nodes& nodes) {
    auto group = comm_group_create(nodes, "g", Device::cpu(), {0, 1});
    if (nodes.rank() == 1) {
      group->abort();  // this node's rank failed and will never join
      return;
    }
    Tensor x = contribution(0, 4);
    try {
      group->communicator(0).all_reduce_sum(x);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("node 1"), std::string::npos) << error;
}

}  // namespace
}  // namespace atom::test
