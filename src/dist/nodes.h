// The processes of a run over several hosts (vLLM's --nnodes, --node-rank, --master-addr,
// --master-port). Node 0 serves a small key-value store (TcpStore, as torch.distributed's
// TCPStore does) on master-addr:master-port; every node connects to it, publishes the address of
// its own listener, and reaches any other node through a connection per named channel
// (Nodes::connect). Collectives between the ranks of several nodes (dist/communicator.h) and
// pipeline stage links (dist/stage_link.h) run over such channels, and the head node's engine
// drives the other nodes' ranks over its control channel (engine/tp_runner.h).
//
// Ranks are placed on nodes in blocks of world / nnodes consecutive ranks, rotated so that node 0
// (the one serving requests) holds the leader, rank 0 of the last pipeline stage, which computes
// the logits (node_of_rank).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "dist/socket.h"

namespace atom {

struct NodeOptions {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // How long a node waits for the others to join, and for a store key.
  double timeout_s = 600;
};

// The node that holds `rank` of a world of `world` ranks whose leader is `leader`: blocks of
// world / nnodes ranks, the leader's block on node 0. world must be a multiple of nnodes.
int node_of_rank(int rank, int world, int nnodes, int leader);

// The key-value store's server, on node 0: SET, blocking GET, and ADD (a counter).
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  int port() const { return listener_.port(); }

 private:
  void serve(Socket s);
  Listener listener_;
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
  std::vector<std::thread> clients_;
  std::vector<Socket*> sockets_;
  bool stop_ = false;
};

// A client of the store. Thread-safe: each call uses a connection of its own while it lasts.
class TcpStore {
 public:
  TcpStore(std::string host, int port, double timeout_s);
  void set(const std::string& key, const std::string& value);
  // Waits until `key` is set (an error after the timeout).
  std::string get(const std::string& key);
  std::string get(const std::string& key, double timeout_s);
  // Adds delta to the counter `key` (0 when absent) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);

 private:
  std::string call(const std::string& request);
  std::string host_;
  int port_;
  double timeout_s_;
  std::mutex mu_;
  std::vector<Socket> idle_;
};

class Nodes {
 public:
  // Joins the run: node 0 starts the store; every node publishes its listener and waits until
  // all nnodes joined. Errors name the flag or the node that is missing.
  explicit Nodes(const NodeOptions& o);
  ~Nodes();
  Nodes(const Nodes&) = delete;
  Nodes& operator=(const Nodes&) = delete;

  int size() const { return o_.nnodes; }
  int rank() const { return o_.node_rank; }
  TcpStore& store() { return *store_; }

  // The connection to node `peer` for `channel` (both nodes call it with the same name; the
  // higher node connects to the lower's listener).
  Socket connect(const std::string& channel, int peer);
  // Every node passes a value; all get the smallest / largest. Calls are matched by name and by
  // their order among calls of that name.
  int64_t min_over_nodes(const std::string& name, int64_t value);
  int64_t max_over_nodes(const std::string& name, int64_t value);
  // Every node passes a text; all get node 0's, and an error naming the first node whose text
  // differs (the nodes of a run must be started with the same model and parallel flags).
  void check_same(const std::string& name, const std::string& text);

 private:
  std::vector<std::string> all_gather(const std::string& name, const std::string& value);
  void accept_loop();
  void join(const std::string& host);  // publishes this node, waits for the others
  void stop();                         // ends the accept thread

  NodeOptions o_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStore> store_;
  std::unique_ptr<Listener> listener_;
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<std::string, int>, Socket> accepted_;  // (channel, from node)
  std::map<std::string, int> rounds_;
  bool stop_ = false;
  bool joined_ = false;
};

// Tensors as bytes (dtype, shape, contents; an undefined tensor stays undefined), for frames.
void wire_put_tensor(Wire& w, const Tensor& t);
Tensor wire_tensor(Wire& w);

}  // namespace atom
