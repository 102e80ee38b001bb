// The hand-off between pipeline stages (vLLM's IntermediateTensors send/recv): rank t of stage s
// gives its tensors to rank t of stage s + 1. One link per such pair, within one process (the
// ranks are threads, dist/rank_threads.h): send() copies the tensors to the host and queues them,
// recv() takes the oldest queued set, waiting until one comes. Queued sets let a stage run ahead
// of the next by several micro-batches.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "core/tensor.h"

namespace atom {

class StageLink {
 public:
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
};

}  // namespace atom
