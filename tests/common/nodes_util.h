// Several nodes in one test process: each node a Nodes object on a thread of its own, joined over
// loopback TCP as separate hosts' processes join (dist/nodes.h).
#pragma once

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "dist/nodes.h"
#include "dist/socket.h"

namespace atom::test {

// A port nothing listens on now (the kernel's choice for a listener just closed).
inline int free_port() {
  Listener l("127.0.0.1", 0);
  return l.port();
}

// Runs body(nodes) for nodes 0..n-1 at once, each joined to one store on a free port; rethrows
// the first node's error after all ended.
inline void on_nodes(int n, const std::function<void(Nodes&)>& body, double timeout_s = 60) {
  const int port = free_port();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k)
    threads.emplace_back([&, k] {
      try {
        NodeOptions o;
        o.nnodes = n;
        o.node_rank = k;
        o.master_port = port;
        o.timeout_s = timeout_s;
        Nodes nodes(o);
        body(nodes);
      } catch (...) {
        errors[static_cast<size_t>(k)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace atom::test
