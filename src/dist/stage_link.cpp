#include "dist/stage_link.h"

#include "core/error.h"

namespace atom {

void StageLink::send(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> copies;
  copies.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    if (!t.defined()) {  // an absent member (a model whose stages hand on no residual)
      copies.emplace_back();
      continue;
    }
    Tensor c = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
    c.copy_from(t);
    copies.push_back(std::move(c));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) fail("pipeline stage link: the receiving stage failed");
    queue_.push_back(std::move(copies));
  }
  cv_.notify_all();
}

std::vector<Tensor> StageLink::recv() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return aborted_ || !queue_.empty(); });
  if (aborted_) fail("pipeline stage link: the previous stage failed");
  std::vector<Tensor> t = std::move(queue_.front());
  queue_.pop_front();
  return t;
}

void StageLink::abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    queue_.clear();
  }
  cv_.notify_all();
}

}  // namespace atom
