#include "kernels/cuda_tuning.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/env.h"

namespace atom::kernels::cuda {

namespace {
// The innermost CudaTuningScope of this thread (null: the defaults).
thread_local const CudaTuning* t_current = nullptr;

int valid_wgmma_pipeline(int n) { return n == 0 || (n >= 2 && n <= 6) ? n : 6; }
}  // namespace

CudaTuning CudaTuning::from_env() {
  CudaTuning t;
  const std::string backend = env_str("ATOM_ATTENTION_BACKEND", "auto");
  t.attention_backend = backend == "mma"      ? PrefillAttention::kMma
                        : backend == "simple" ? PrefillAttention::kSimple
                                              : PrefillAttention::kAuto;
  t.attention_m_atoms = static_cast<int>(env_int("ATOM_ATTENTION_M_ATOMS", 0));
  t.wgmma_warpgroups = static_cast<int>(env_int("ATOM_WGMMA_WARPGROUPS", 2));
  const char* pipeline = std::getenv("ATOM_WGMMA_PIPELINE");
  t.wgmma_pipeline = pipeline ? std::atoi(pipeline) : 6;
  t.attention_split_min_tiles = static_cast<int>(env_int("ATOM_ATTENTION_SPLIT_MIN_TILES", 4));
  t.skinny_max_m = static_cast<int>(env_int("ATOM_SKINNY_GEMM_MAX_M", 2));
  t.skinny_split_max_n = env_int("ATOM_SKINNY_SPLIT_MAX_N", int64_t{1} << 40);
  t.fuse_qkv_rope = env_int("ATOM_FUSE_QKV_ROPE", 1) != 0;
  t.fuse_qk_norm_rope = env_int("ATOM_FUSE_QK_NORM_ROPE", 1) != 0;
  const std::string path = env_str("ATOM_FP8_GEMM_PATH", "auto");
  t.fp8_path = path == "general"     ? Fp8Path::kGeneral
               : path == "no_skinny" ? Fp8Path::kNoSkinny
                                     : Fp8Path::kAuto;
  const std::string tiles = env_str("ATOM_FP8_GEMM_TILES", "auto");
  t.fp8_tiles = tiles == "cp_async" ? Fp8Tiles::kCpAsync
                : tiles == "tma"    ? Fp8Tiles::kTma
                                    : Fp8Tiles::kAuto;
  t.fp8_skinny_rows = static_cast<int>(env_int("ATOM_FP8_SKINNY_ROWS", 0));
  t.fp8_quant_one_pass = env_int("ATOM_FP8_QUANT_ONE_PASS", 1) != 0;
  t.fp8_cublaslt_split = env_int("ATOM_FP8_CUBLASLT_SPLIT", 1) != 0;
  const std::string lt = env_str("ATOM_FP8_GEMM_CUBLASLT", "auto");
  t.fp8_cublaslt = lt == "on"    ? Fp8CublasLt::kOn
                   : lt == "off" ? Fp8CublasLt::kOff
                                 : Fp8CublasLt::kAuto;
  t.mla_simple = env_str("ATOM_MLA_BACKEND", "auto") == "simple";
  t.mla_pipeline = static_cast<int>(env_int("ATOM_MLA_PIPELINE", 0));
  t.moe_decode_max_rows = static_cast<int>(
      std::clamp<long>(env_int("ATOM_MOE_DECODE_MAX_ROWS", 8), 0, kMoeDecodeMaxRowsCap));
  t.moe_decode_max_rows_mxfp4 = static_cast<int>(
      std::clamp<long>(env_int("ATOM_MOE_DECODE_MAX_ROWS_MXFP4", 256), 0, kMoeDecodeMaxRowsCap));
  t.moe_decode_max_rows_fp8 = static_cast<int>(
      std::clamp<long>(env_int("ATOM_MOE_DECODE_MAX_ROWS_FP8", 64), 0, kMoeDecodeMaxRowsCap));
  t.moe_decode_depth = static_cast<int>(env_int("ATOM_MOE_DECODE_DEPTH", 2));
  t.moe_gemm_tile_rows = static_cast<int>(env_int("ATOM_MOE_GEMM_TILE_ROWS", 0));
  t.moe_dense_min_rows = static_cast<int>(env_int("ATOM_MOE_DENSE_MIN_ROWS", 256));
  t.moe_dense_max_slots = static_cast<int>(env_int("ATOM_MOE_DENSE_MAX_SLOTS", 16));
  return t.normalized();
}

CudaTuning CudaTuning::normalized() const {
  CudaTuning t = *this;
  t.wgmma_warpgroups = t.wgmma_warpgroups == 1 ? 1 : 2;
  t.wgmma_pipeline = valid_wgmma_pipeline(t.wgmma_pipeline);
  t.wgmma_order_across = t.wgmma_order_across < 0 ? -1 : t.wgmma_order_across > 0;
  t.attention_split_min_tiles = std::clamp(t.attention_split_min_tiles, 1, 16);
  t.fp8_skinny_rows = t.fp8_skinny_rows == 2 || t.fp8_skinny_rows == 4 ? t.fp8_skinny_rows : 0;
  t.moe_decode_max_rows = std::clamp(t.moe_decode_max_rows, 0, kMoeDecodeMaxRowsCap);
  t.moe_decode_max_rows_mxfp4 = std::clamp(t.moe_decode_max_rows_mxfp4, 0, kMoeDecodeMaxRowsCap);
  t.moe_decode_max_rows_fp8 = std::clamp(t.moe_decode_max_rows_fp8, 0, kMoeDecodeMaxRowsCap);
  t.moe_decode_depth = t.moe_decode_depth == 4 ? 4 : 2;
  t.moe_gemm_tile_rows =
      t.moe_gemm_tile_rows == 64 || t.moe_gemm_tile_rows == 128 ? t.moe_gemm_tile_rows : 0;
  t.moe_dense_min_rows = std::max(t.moe_dense_min_rows, 0);
  t.moe_dense_max_slots = std::max(t.moe_dense_max_slots, 0);
  return t;
}

bool CudaTuning::operator==(const CudaTuning&) const = default;

const CudaTuning& default_cuda_tuning() {
  static const CudaTuning t = CudaTuning::from_env();
  return t;
}

const CudaTuning& cuda_tuning() { return t_current ? *t_current : default_cuda_tuning(); }

CudaTuningScope::CudaTuningScope(const CudaTuning& t) : tuning_(t.normalized()), prev_(t_current) {
  t_current = &tuning_;
}

CudaTuningScope::~CudaTuningScope() { t_current = prev_; }

}  // namespace atom::kernels::cuda
