#include <map>
#include <mutex>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"

namespace atom {

namespace {

// Freed blocks by size. Sizes are rounded (512 B below 1 MiB, 2 MiB above) so that steps which
// allocate similar tensors reuse blocks instead of calling cudaMalloc, which synchronises the
// device. Reuse is safe without events because all of atom's device work on one device is
// ordered: runner streams are blocking streams, ordered with the legacy default stream.
struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;
  size_t cached = 0;
};

constexpr int kMaxDevices = 64;

Pool& pool(int device) {
  static Pool* pools = new Pool[kMaxDevices];  // never destroyed: tensors may outlive statics
  return pools[device];
}

size_t round_size(size_t n) {
  if (n == 0) n = 1;
  if (n < (size_t{1} << 20)) return (n + 511) / 512 * 512;
  const size_t g = size_t{2} << 20;
  return (n + g - 1) / g * g;
}

void release_all(Pool& p) {
  for (auto& [size, ptr] : p.free_blocks) cudaFree(ptr);
  p.free_blocks.clear();
  p.cached = 0;
}

}  // namespace

std::shared_ptr<Storage> cuda_storage_alloc(size_t nbytes, Device device) {
  ATOM_CHECK(device.index >= 0 && device.index < kMaxDevices, "device index {}", device.index);
  cuda_device_check(device.index);
  const size_t size = round_size(nbytes);
  Pool& p = pool(device.index);
  void* ptr = nullptr;
  size_t got = 0;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.free_blocks.lower_bound(size);
    if (it != p.free_blocks.end() && it->first <= size + size / 4) {
      ptr = it->second;
      got = it->first;
      p.cached -= got;
      p.free_blocks.erase(it);
    }
  }
  if (!ptr) {
    CUDA_CHECK(cudaSetDevice(device.index));
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      {
        std::lock_guard<std::mutex> lock(p.mu);
        release_all(p);
      }
      err = cudaMalloc(&ptr, size);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("out of GPU memory on {}: asked for {} bytes, {} of {} bytes free", device.str(), nbytes,
           free_b, total_b);
    }
    got = size;
  }
  const int dev = device.index;
  return std::make_shared<Storage>(ptr, nbytes, device, [dev, got](void* q) {
    Pool& pl = pool(dev);
    std::lock_guard<std::mutex> lock(pl.mu);
    pl.free_blocks.emplace(got, q);
    pl.cached += got;
  });
}

size_t cuda_cached_bytes(int device) {
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  return p.cached;
}

void cuda_cache_release(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaDeviceSynchronize());
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  release_all(p);
}

}  // namespace atom
