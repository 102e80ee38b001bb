#include "dist/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "core/log.h"
#include "core/tensor.h"

namespace atom {

namespace {

void nccl_check(ncclResult_t r, ncclComm_t comm, const char* what) {
  if (r == ncclSuccess) return;
  const char* detail = ncclGetLastError(comm);
  fail("NCCL error in {}: {}{}{}", what, ncclGetErrorString(r), detail && *detail ? ": " : "",
       detail ? detail : "");
}

ncclDataType_t nccl_type(DType t, const char* what) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    default:
      fail("{}: NCCL collectives take F32, BF16 or F16 tensors, got {}", what, dtype_name(t));
  }
}

}  // namespace

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(Tensor& x) override {
    const ncclComm_t comm = check(x, "all_reduce_sum");
    if (x.numel() == 0) return;
    nccl_check(
        ncclAllReduce(x.data(), x.data(), static_cast<size_t>(x.numel()),
                      nccl_type(x.dtype(), "all_reduce_sum"), ncclSum, comm, cuda_current_stream()),
        comm, "all_reduce_sum");
  }

  // NCCL gathers along the outermost dimension: ranks' blocks land one after another. Gathering
  // along the last dimension is that gather into a scratch buffer, then one strided 2-D copy per
  // rank into its columns of `out` (a copy that graph capture records too). A single row needs
  // no rearranging, so it is gathered straight into `out`.
  void all_gather_last_dim(const Tensor& in, Tensor& out) override {
    const ncclComm_t comm = check(in, "all_gather_last_dim");
    check(out, "all_gather_last_dim");
    const int64_t w = in.size(-1);
    ATOM_CHECK(
        in.dtype() == out.dtype() && out.size(-1) == w * size_ && out.numel() == in.numel() * size_,
        "all_gather_last_dim: {} from each of {} ranks into {}", in.str(), size_, out.str());
    if (in.numel() == 0) return;
    const ncclDataType_t type = nccl_type(in.dtype(), "all_gather_last_dim");
    const cudaStream_t stream = cuda_current_stream();
    const int64_t rows = in.numel() / w;
    if (rows == 1) {
      nccl_check(
          ncclAllGather(in.data(), out.data(), static_cast<size_t>(in.numel()), type, comm, stream),
          comm, "all_gather_last_dim");
      return;
    }
    char* gathered = scratch(in.nbytes() * static_cast<size_t>(size_), stream);
    nccl_check(
        ncclAllGather(in.data(), gathered, static_cast<size_t>(in.numel()), type, comm, stream),
        comm, "all_gather_last_dim");
    const size_t esz = static_cast<size_t>(dtype_bits(in.dtype()) / 8);
    const size_t width = static_cast<size_t>(w) * esz;
    for (int r = 0; r < size_; ++r)
      CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(out.data()) + r * width, width * size_,
                                   gathered + r * in.nbytes(), width, width,
                                   static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream));
  }

  // Best effort, for a rank that failed: the others' kernels waiting on it end, so their threads
  // stop waiting; a rank still issuing collectives at that moment gets errors.
  void abort() {
    if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommAbort(c);
  }

  void destroy() {
    if (ncclComm_t c = comm_.exchange(nullptr)) {
      cudaSetDevice(device_);
      ncclCommDestroy(c);
    }
  }

 private:
  // The communicator, after checking that `t` suits it and that this thread is on its device.
  ncclComm_t check(const Tensor& t, const char* what) const {
    const ncclComm_t comm = comm_.load();
    ATOM_CHECK(comm, "{}: the NCCL communicator of rank {} was aborted", what, rank_);
    ATOM_CHECK(t.device() == Device::cuda(device_) && t.is_contiguous(),
               "{}: rank {} needs a contiguous tensor on cuda:{}, got {}", what, rank_, device_,
               t.str());
    int current = -1;
    CUDA_CHECK(cudaGetDevice(&current));
    ATOM_CHECK(current == device_, "{}: rank {} (cuda:{}) called from a thread on cuda:{}", what,
               rank_, device_, current);
    return comm;
  }

  // At least `bytes` of device memory. A buffer that grows is replaced but kept: a captured CUDA
  // graph may still gather into the old one. Captures follow an eager warm-up of the same shapes,
  // so the buffer never grows inside one.
  char* scratch(size_t bytes, cudaStream_t stream) {
    if (scratch_.empty() || scratch_.back().nbytes() < bytes) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
      ATOM_CHECK(
          status == cudaStreamCaptureStatusNone,
          "all_gather_last_dim: the gather buffer would grow to {} bytes inside a CUDA graph "
          "capture (no eager warm-up of this shape came first)",
          bytes);
      const size_t grown = scratch_.empty() ? 0 : scratch_.back().nbytes() * 3 / 2;
      scratch_.push_back(Tensor::empty({static_cast<int64_t>(std::max(bytes, grown))}, DType::kU8,
                                       Device::cuda(device_)));
    }
    return static_cast<char*>(scratch_.back().data());
  }

  std::atomic<ncclComm_t> comm_;
  int rank_, size_, device_;
  std::vector<Tensor> scratch_;  // the last is in use; older ones stay for captured graphs
};

NcclGroup::NcclGroup(const std::vector<int>& devices) {
  ATOM_CHECK(!devices.empty(), "NcclGroup needs at least one device");
  for (int d : devices) cuda_device_check(d);
  // Multicast (NVLS) stays off unless the user's environment asks for it.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  int current = 0;
  CUDA_CHECK(cudaGetDevice(&current));
  const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data());
  CUDA_CHECK(cudaSetDevice(current));
  nccl_check(r, nullptr, "ncclCommInitAll");
  int version = 0;
  ncclGetVersion(&version);
  log_info("NCCL {}: {} communicators (cuda:{} to cuda:{})", version, n, devices.front(),
           devices.back());
  for (int i = 0; i < n; ++i)
    comms_.push_back(std::make_unique<NcclCommunicator>(comms[static_cast<size_t>(i)], i, n,
                                                        devices[static_cast<size_t>(i)]));
}

NcclGroup::~NcclGroup() {
  std::vector<std::thread> threads;
  for (auto& c : comms_) threads.emplace_back([&c] { c->destroy(); });
  for (auto& t : threads) t.join();
}

Communicator& NcclGroup::communicator(int rank) { return *comms_.at(static_cast<size_t>(rank)); }

void NcclGroup::abort() {
  for (auto& c : comms_) c->abort();
}

}  // namespace atom
