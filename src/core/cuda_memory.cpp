#include "core/cuda_check.h"

namespace atom {

std::shared_ptr<Storage> cuda_storage_alloc(size_t nbytes, Device device) {
  CUDA_CHECK(cudaSetDevice(device.index));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, nbytes == 0 ? 256 : nbytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("out of GPU memory on {}: asked for {} bytes, {} of {} bytes free", device.str(), nbytes,
         free_b, total_b);
  }
  return std::make_shared<Storage>(p, nbytes, device, [](void* q) { cudaFree(q); });
}

}  // namespace atom
