#include "dist/communicator.h"

#include <cstring>

#include "core/convert.h"
#include "core/error.h"

namespace atom {

namespace {
// Copies `in` into out[..., offset : offset + in.last] (CPU, contiguous float/any dtype).
void place_last_dim(const Tensor& in, Tensor& out, int64_t offset) {
  const int64_t w = in.size(-1), W = out.size(-1);
  const int64_t rows = in.numel() / (w ? w : 1);
  const int64_t esz = dtype_bits(in.dtype()) / 8;
  const char* src = static_cast<const char*>(in.data());
  char* dst = static_cast<char*>(out.data());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + (r * W + offset) * esz, src + r * w * esz, static_cast<size_t>(w * esz));
}
}  // namespace

void SoloCommunicator::all_gather_last_dim(const Tensor& in, Tensor& out) {
  ATOM_CHECK(out.shape() == in.shape(), "all_gather on one rank: {} vs {}", in.str(), out.str());
  out.copy_from(in);
}

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size_; }

  void all_reduce_sum(Tensor& x) override {
    ATOM_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dtype() == DType::kF32,
               "LocalGroup all_reduce needs a contiguous CPU F32 tensor, got {}", x.str());
    {
      std::lock_guard<std::mutex> lock(g_.mu_);
      g_.slots_[rank_] = x;
    }
    g_.barrier(true);
    // Every rank sums all contributions in rank order (identical results everywhere).
    Tensor sum = Tensor::zeros(x.shape(), DType::kF32);
    float* s = sum.ptr<float>();
    for (int r = 0; r < g_.size_; ++r) {
      const float* p = g_.slots_[r].ptr<float>();
      for (int64_t i = 0; i < x.numel(); ++i) s[i] += p[i];
    }
    g_.barrier();  // everyone has read the slots before anyone overwrites its own
    x.copy_from(sum);
  }

  void all_gather_last_dim(const Tensor& in, Tensor& out) override {
    ATOM_CHECK(in.device().is_cpu() && in.is_contiguous() && out.is_contiguous(),
               "LocalGroup all_gather needs contiguous CPU tensors");
    ATOM_CHECK(out.size(-1) == in.size(-1) * g_.size_, "all_gather: {} into {}", in.str(),
               out.str());
    {
      std::lock_guard<std::mutex> lock(g_.mu_);
      g_.slots_[rank_] = in;
    }
    g_.barrier(true);
    for (int r = 0; r < g_.size_; ++r) place_last_dim(g_.slots_[r], out, r * in.size(-1));
    g_.barrier();
  }

 private:
  LocalGroup& g_;
  int rank_;
};

LocalGroup::LocalGroup(int size) : size_(size), local_count_(size), slots_(size) {
  ATOM_CHECK(size >= 1, "group size {}", size);
}

LocalGroup::LocalGroup(int size, std::vector<int> local, Exchange exchange)
    : size_(size),
      local_count_(static_cast<int>(local.size())),
      exchange_(std::move(exchange)),
      slots_(size) {
  ATOM_CHECK(size >= 1 && !local.empty() && local_count_ <= size, "group of {} ranks, {} local",
             size, local_count_);
}

std::unique_ptr<Communicator> LocalGroup::communicator(int rank) {
  ATOM_CHECK(rank >= 0 && rank < size_, "rank {} of {}", rank, size_);
  return std::make_unique<LocalCommunicator>(*this, rank);
}

void LocalGroup::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

void LocalGroup::barrier(bool exchange) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) fail("tensor-parallel group aborted: another rank failed");
  const long gen = generation_;
  if (++arrived_ == local_count_) {
    if (exchange && exchange_) {
      // The other local ranks wait; the slots are this thread's until the generation moves on.
      try {
        exchange_(slots_);
      } catch (...) {
        aborted_ = true;
        cv_.notify_all();
        throw;
      }
    }
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
  } else {
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) fail("tensor-parallel group aborted: another rank failed");
  }
}

}  // namespace atom
