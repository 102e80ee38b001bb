// The hand-off between pipeline stages (vLLM's IntermediateTensors send/recv): rank t of stage s
// gives its tensors to rank t of stage s + 1. One link per such pair, within one process (the
// ranks are threads, dist/rank_threads.h): send() copies the tensors to the host and queues them,
// recv() takes the oldest queued set, waiting until one comes. Queued sets let a stage run ahead
// of the next by several micro-batches. When the two ranks are on different nodes
// (dist/nodes.h), the sending node's link writes each set to a connection (to_socket) and the
// receiving node's link reads them from it on a thread of its own into its queue (from_socket).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "dist/socket.h"

namespace atom {

class StageLink {
 public:
  StageLink() = default;
  ~StageLink();
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;
  // The receiving rank is on the node at the other end of `s`: send() writes there.
  void to_socket(Socket s);
  // The sending rank is on the node at the other end of `s`: its sets arrive in the queue.
  void from_socket(Socket s);

  // Copies `tensors` (any device) to the host and queues them for the next stage; an undefined
  // tensor arrives undefined.
  void send(const std::vector<Tensor>& tensors);
  // The oldest queued set (host tensors); waits for one. Throws once the link is aborted.
  std::vector<Tensor> recv();
  // Makes every waiting and later recv() throw: a failed stage will never send.
  void abort();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<Tensor>> queue_;
  bool aborted_ = false;
  bool closed_ = false;  // the sending node's connection ended
  std::unique_ptr<Socket> socket_;
  bool sends_ = false;
  std::thread reader_;
};

}  // namespace atom
