#include "kernels/cuda/cublaslt_shared.h"

#include <map>
#include <mutex>

#include "core/cuda_check.h"
#include "core/error.h"

namespace atom::kernels::cuda {

namespace {

struct Shared {
  std::mutex mu;
  cublasLtHandle_t handles[64] = {};
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;
};

Shared& shared() {
  static Shared* s = new Shared;  // never destroyed: graphs and handles outlive statics
  return *s;
}

}  // namespace

cudaDataType_t cuda_data_type(DType t, const char* op) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      fail("{}: dtype {} is not supported on CUDA", op, dtype_name(t));
  }
}

cublasLtHandle_t lt_handle(int device, std::string* why) {
  ATOM_CHECK(device >= 0 && device < 64, "cuBLASLt: device {}", device);
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.handles[device]) {
    const cublasStatus_t st = cublasLtCreate(&s.handles[device]);
    if (st != CUBLAS_STATUS_SUCCESS) {
      s.handles[device] = nullptr;
      if (why)
        *why = std::string("cublasLtCreate: ") + cublasLtGetStatusName(st) + " (" +
               cublasLtGetStatusString(st) + ")";
      return nullptr;
    }
  }
  return s.handles[device];
}

void* lt_workspace(int device, cudaStream_t stream, bool allocate) {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.workspaces.find({device, stream});
  if (it != s.workspaces.end()) return it->second;
  if (!allocate) return nullptr;
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, kLtWorkspaceBytes));  // held for the process
  s.workspaces.emplace(std::make_pair(device, stream), p);
  return p;
}

}  // namespace atom::kernels::cuda
