#include "core/cuda_stream.h"

#include <atomic>

#include "core/cuda_check.h"

namespace atom {

namespace {
thread_local cudaStream_t g_current = nullptr;
}  // namespace

cudaStream_t cuda_current_stream() { return g_current; }

CudaStreamGuard::CudaStreamGuard(cudaStream_t s) : prev_(g_current) { g_current = s; }
CudaStreamGuard::~CudaStreamGuard() { g_current = prev_; }

CudaStream::CudaStream(int device) {
  cuda_device_check(device);
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
}

CudaStream::~CudaStream() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

void CudaStream::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

ForkedStream::ForkedStream(int device) {
  cuda_device_check(device);
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
}

ForkedStream::~ForkedStream() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (forked_) cudaEventDestroy(forked_);
  if (joined_) cudaEventDestroy(joined_);
}

void ForkedStream::fork() {
  CUDA_CHECK(cudaEventRecord(forked_, cuda_current_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, forked_, 0));
}

void ForkedStream::join() {
  CUDA_CHECK(cudaEventRecord(joined_, stream_));
  CUDA_CHECK(cudaStreamWaitEvent(cuda_current_stream(), joined_, 0));
}

void cuda_device_check(int device) {
  static std::atomic<uint64_t> passed{0};
  if (device >= 0 && device < 64 && (passed.load() >> device & 1)) return;
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    fail("no usable NVIDIA GPU: {}",
         err != cudaSuccess ? fmt::format("the CUDA driver reports {} ({})", cudaGetErrorName(err),
                                          cudaGetErrorString(err))
                            : std::string("no device is visible"));
  }
  if (device < 0 || device >= n) fail("cuda:{} requested but {} GPU(s) are visible", device, n);
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  if (p.major != 9 || p.minor != 0)
    fail("GPU cuda:{} ({}) has compute capability {}.{}; this build of atom carries CUDA kernels "
         "for sm_90a only (Hopper: H100, H200)",
         device, p.name, p.major, p.minor);
  if (device < 64) passed.fetch_or(uint64_t{1} << device);
}

CudaMemoryInfo cuda_memory_info(int device) {
  CudaMemoryInfo m;
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  m.cached_bytes = cuda_cached_bytes(device);
  return m;
}

}  // namespace atom
