#include "dist/stage_link.h"

#include "core/error.h"
#include "dist/nodes.h"

namespace atom {

StageLink::~StageLink() {
  if (socket_) socket_->shutdown();
  if (reader_.joinable()) reader_.join();
}

void StageLink::to_socket(Socket s) {
  socket_ = std::make_unique<Socket>(std::move(s));
  sends_ = true;
}

void StageLink::from_socket(Socket s) {
  socket_ = std::make_unique<Socket>(std::move(s));
  reader_ = std::thread([this] {
    try {
      for (;;) {
        Wire w(socket_->recv_frame());
        std::vector<Tensor> set;
        const int64_t n = w.i64();
        for (int64_t i = 0; i < n; ++i) set.push_back(wire_tensor(w));
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (aborted_) return;
          queue_.push_back(std::move(set));
        }
        cv_.notify_all();
      }
    } catch (const std::exception&) {
      // The sending node ended its side (or failed): what it sent stays to be received, then a
      // waiting recv() fails instead of hanging.
      {
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
      }
      cv_.notify_all();
    }
  });
}

void StageLink::send(const std::vector<Tensor>& tensors) {
  if (sends_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) fail("pipeline stage link: the receiving stage failed");
    }
    Wire w;
    w.put_i64(static_cast<int64_t>(tensors.size()));
    for (const Tensor& t : tensors) wire_put_tensor(w, t);
    socket_->send_frame(w.buffer());
    return;
  }
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
  cv_.wait(lock, [this] { return aborted_ || closed_ || !queue_.empty(); });
  if (aborted_ || queue_.empty())
    fail("pipeline stage link: the previous stage failed{}",
         closed_ ? " (its node closed the connection)" : "");
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
  if (socket_) socket_->shutdown();  // the other node's end fails too
}

}  // namespace atom
