// CUDA streams, device checks and the device-memory cache. Only included when ATOM_HAVE_CUDA is
// set. Each thread has a current stream (the legacy default stream until a CudaStreamGuard names
// another), so a model runner can put its work - and CUDA graph capture - on a stream of its own
// without passing a stream through every layer and kernel entry point.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace atom {

cudaStream_t cuda_current_stream();

// Makes `s` the calling thread's current stream for the guard's lifetime.
class CudaStreamGuard {
 public:
  explicit CudaStreamGuard(cudaStream_t s);
  ~CudaStreamGuard();
  CudaStreamGuard(const CudaStreamGuard&) = delete;
  CudaStreamGuard& operator=(const CudaStreamGuard&) = delete;

 private:
  cudaStream_t prev_;
};

// An owned stream on `device`. It is a blocking stream: work on the legacy default stream (weight
// uploads, tensors made outside a runner) stays ordered with it.
class CudaStream {
 public:
  explicit CudaStream(int device);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

// A second stream beside the calling thread's current one, for work that may run alongside it:
// fork() makes it wait for everything the current stream has enqueued, join() makes the current
// stream wait for everything enqueued on it since. Both are stream-ordered (events), so they are
// captured into a CUDA graph as a fork and a join of its nodes. Made outside any capture.
class ForkedStream {
 public:
  explicit ForkedStream(int device);
  ~ForkedStream();
  ForkedStream(const ForkedStream&) = delete;
  ForkedStream& operator=(const ForkedStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void fork();
  void join();

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr;
};

// Throws a clear error unless `device` exists and is a GPU this build carries kernels for
// (compute capability 9.0: H100, H200; the kernels are built for sm_90a). Cached once it passed.
void cuda_device_check(int device);

// Returns cached device memory (blocks freed by tensors, kept for reuse) to the driver, so that
// cudaMemGetInfo counts it as free.
void cuda_cache_release(int device);

struct CudaMemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  size_t cached_bytes = 0;  // held by atom's cache, counted as used by the driver
};
CudaMemoryInfo cuda_memory_info(int device);

}  // namespace atom
