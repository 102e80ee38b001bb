#include "core/device.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

#ifdef ATOM_HAVE_CUDA
#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#endif

namespace atom {

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  return index == 0 ? "cuda" : fmt::format("cuda:{}", index);
}

Device device_parse(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.starts_with("cuda:")) {
    const std::string idx(s.substr(5));
    char* end = nullptr;
    const long i = std::strtol(idx.c_str(), &end, 10);
    if (!idx.empty() && *end == '\0' && i >= 0) return Device::cuda(static_cast<int>(i));
  }
  fail("unknown device '{}': expected cpu, cuda or cuda:N", s);
}

bool cuda_available() {
#ifdef ATOM_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

Device device_default() { return cuda_available() ? Device::cuda(0) : Device::cpu(); }

int cuda_device_count() {
#ifdef ATOM_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

void device_make_current(Device d) {
  if (d.is_cpu()) return;
#ifdef ATOM_HAVE_CUDA
  cuda_device_check(d.index);
  CUDA_CHECK(cudaSetDevice(d.index));
#else
  fail("device {} requested but this build of atom has no CUDA backend", d.str());
#endif
}

void device_synchronize(Device d) {
  if (d.is_cpu()) return;
#ifdef ATOM_HAVE_CUDA
  int current = 0;
  CUDA_CHECK(cudaGetDevice(&current));
  CUDA_CHECK(cudaSetDevice(d.index));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaSetDevice(current));
#else
  fail("device {} needs the CUDA backend", d.str());
#endif
}

namespace {
constexpr size_t kCpuAlign = 64;
}

std::shared_ptr<Storage> storage_alloc(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    const size_t n = (nbytes + kCpuAlign - 1) / kCpuAlign * kCpuAlign;
    void* p = std::aligned_alloc(kCpuAlign, n == 0 ? kCpuAlign : n);
    if (!p) fail("out of host memory allocating {} bytes", nbytes);
    return std::make_shared<Storage>(p, nbytes, device, [](void* q) { std::free(q); });
  }
#ifdef ATOM_HAVE_CUDA
  return cuda_storage_alloc(nbytes, device);
#else
  fail("device {} requested but this build of atom has no CUDA backend", device.str());
#endif
}

void memory_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n) {
  if (n == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
#ifdef ATOM_HAVE_CUDA
  // On the calling thread's stream, so copies stay ordered with the kernels around them (and a
  // device-to-device copy can be captured into a CUDA graph). Only a copy to the host waits: a
  // pageable host source is staged before cudaMemcpyAsync returns.
  const cudaStream_t s = cuda_current_stream();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s));
  if (dst_dev.is_cpu()) CUDA_CHECK(cudaStreamSynchronize(s));
#else
  fail("copy between {} and {} needs the CUDA backend", dst_dev.str(), src_dev.str());
#endif
}

void memory_zero(void* dst, Device dev, size_t n) {
  if (n == 0) return;
  if (dev.is_cpu()) {
    std::memset(dst, 0, n);
    return;
  }
#ifdef ATOM_HAVE_CUDA
  CUDA_CHECK(cudaMemsetAsync(dst, 0, n, cuda_current_stream()));
#else
  fail("device {} needs the CUDA backend", dev.str());
#endif
}

}  // namespace atom
