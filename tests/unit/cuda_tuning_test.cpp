// The CUDA kernels' tuning (kernels/cuda_tuning.h) is plain data, so its rules are tested on the
// CPU: the environment is parsed as the kernels used to parse it, out-of-range values map as
// they did, and a scope changes only its own thread's tuning, for its lifetime.
#include "kernels/cuda_tuning.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace atom::kernels::cuda {
namespace {

// Sets environment variables for one test and removes them after.
struct Env {
  explicit Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      names.push_back(k);
      setenv(k, v, 1);
    }
  }
  ~Env() {
    for (const char* k : names) unsetenv(k);
  }
  std::vector<const char*> names;
};

TEST(CudaTuning, DefaultsAreTheH200Choices) {
  const CudaTuning t = CudaTuning::from_env();
  EXPECT_EQ(t.attention_backend, PrefillAttention::kAuto);
  EXPECT_EQ(t.attention_m_atoms, 0);
  EXPECT_EQ(t.wgmma_warpgroups, 2);
  EXPECT_EQ(t.wgmma_pipeline, 6);
  EXPECT_EQ(t.wgmma_order_across, -1);
  EXPECT_TRUE(t.attention_merge_in_kernel);
  EXPECT_EQ(t.attention_split_min_tiles, 4);
  EXPECT_EQ(t.skinny_max_m, 2);
  EXPECT_EQ(t.skinny_split_max_n, int64_t{1} << 40);
  EXPECT_TRUE(t.fuse_qkv_rope);
  EXPECT_TRUE(t.fuse_qk_norm_rope);
  EXPECT_EQ(t.fp8_path, Fp8Path::kAuto);
  EXPECT_EQ(t.fp8_tiles, Fp8Tiles::kAuto);
  EXPECT_EQ(t.fp8_cublaslt, Fp8CublasLt::kAuto);
  EXPECT_EQ(t.fp8_skinny_rows, 0);
  EXPECT_TRUE(t.fp8_quant_one_pass);
  EXPECT_TRUE(t.fp8_cublaslt_split);
  EXPECT_FALSE(t.mla_simple);
  EXPECT_EQ(t.mla_pipeline, 0);
  EXPECT_EQ(t.moe_decode_max_rows, 8);
  EXPECT_EQ(t.moe_decode_max_rows_mxfp4, 256);
  EXPECT_EQ(t.moe_decode_depth, 2);
  EXPECT_EQ(t.moe_gemm_tile_rows, 0);
  EXPECT_EQ(t.moe_dense_min_rows, 256);
  EXPECT_EQ(t.moe_dense_max_slots, 16);
  EXPECT_EQ(t, CudaTuning{});
}

TEST(CudaTuning, ReadsEveryVariable) {
  const Env env({{"ATOM_ATTENTION_BACKEND", "mma"},
                 {"ATOM_ATTENTION_M_ATOMS", "2"},
                 {"ATOM_ATTENTION_SPLIT_MIN_TILES", "1"},
                 {"ATOM_WGMMA_WARPGROUPS", "1"},
                 {"ATOM_WGMMA_PIPELINE", "4"},
                 {"ATOM_SKINNY_GEMM_MAX_M", "3"},
                 {"ATOM_SKINNY_SPLIT_MAX_N", "8192"},
                 {"ATOM_FUSE_QKV_ROPE", "0"},
                 {"ATOM_FUSE_QK_NORM_ROPE", "0"},
                 {"ATOM_FP8_GEMM_PATH", "no_skinny"},
                 {"ATOM_FP8_GEMM_TILES", "cp_async"},
                 {"ATOM_FP8_SKINNY_ROWS", "4"},
                 {"ATOM_FP8_QUANT_ONE_PASS", "0"},
                 {"ATOM_FP8_CUBLASLT_SPLIT", "0"},
                 {"ATOM_MLA_BACKEND", "simple"},
                 {"ATOM_MLA_PIPELINE", "1"},
                 {"ATOM_MOE_DECODE_MAX_ROWS", "64"},
                 {"ATOM_MOE_DECODE_MAX_ROWS_MXFP4", "32"},
                 {"ATOM_MOE_DECODE_DEPTH", "4"},
                 {"ATOM_MOE_GEMM_TILE_ROWS", "128"},
                 {"ATOM_MOE_DENSE_MIN_ROWS", "1024"},
                 {"ATOM_MOE_DENSE_MAX_SLOTS", "512"}});
  const CudaTuning t = CudaTuning::from_env();
  EXPECT_EQ(t.attention_backend, PrefillAttention::kMma);
  EXPECT_EQ(t.attention_m_atoms, 2);
  EXPECT_EQ(t.attention_split_min_tiles, 1);
  EXPECT_EQ(t.wgmma_warpgroups, 1);
  EXPECT_EQ(t.wgmma_pipeline, 4);
  EXPECT_EQ(t.skinny_max_m, 3);
  EXPECT_EQ(t.skinny_split_max_n, 8192);
  EXPECT_FALSE(t.fuse_qkv_rope);
  EXPECT_FALSE(t.fuse_qk_norm_rope);
  EXPECT_EQ(t.fp8_path, Fp8Path::kNoSkinny);
  EXPECT_EQ(t.fp8_tiles, Fp8Tiles::kCpAsync);
  EXPECT_EQ(t.fp8_skinny_rows, 4);
  EXPECT_FALSE(t.fp8_quant_one_pass);
  EXPECT_FALSE(t.fp8_cublaslt_split);
  EXPECT_TRUE(t.mla_simple);
  EXPECT_EQ(t.mla_pipeline, 1);
  EXPECT_EQ(t.moe_decode_max_rows, 64);
  EXPECT_EQ(t.moe_decode_max_rows_mxfp4, 32);
  EXPECT_EQ(t.moe_decode_depth, 4);
  EXPECT_EQ(t.moe_gemm_tile_rows, 128);
  EXPECT_EQ(t.moe_dense_min_rows, 1024);
  EXPECT_EQ(t.moe_dense_max_slots, 512);
  {
    const Env other({{"ATOM_ATTENTION_BACKEND", "simple"},
                     {"ATOM_FP8_GEMM_PATH", "general"},
                     {"ATOM_FP8_GEMM_TILES", "tma"},
                     {"ATOM_FP8_GEMM_CUBLASLT", "off"}});
    const CudaTuning u = CudaTuning::from_env();
    EXPECT_EQ(u.attention_backend, PrefillAttention::kSimple);
    EXPECT_EQ(u.fp8_path, Fp8Path::kGeneral);
    EXPECT_EQ(u.fp8_tiles, Fp8Tiles::kTma);
    EXPECT_EQ(u.fp8_cublaslt, Fp8CublasLt::kOff);
  }
  {
    const Env lt({{"ATOM_FP8_GEMM_CUBLASLT", "on"}});
    EXPECT_EQ(CudaTuning::from_env().fp8_cublaslt, Fp8CublasLt::kOn);
  }
}

// Out-of-range values map as the environment's always did (and as the old setters did).
TEST(CudaTuning, OutOfRangeValuesMapAsBefore) {
  {
    const Env env({{"ATOM_WGMMA_WARPGROUPS", "3"},
                   {"ATOM_WGMMA_PIPELINE", "1"},
                   {"ATOM_FP8_SKINNY_ROWS", "3"},
                   {"ATOM_MOE_DECODE_MAX_ROWS", "100000"},
                   {"ATOM_MOE_DECODE_MAX_ROWS_MXFP4", "-4"},
                   {"ATOM_MOE_DECODE_DEPTH", "3"},
                   {"ATOM_MOE_GEMM_TILE_ROWS", "96"},
                   {"ATOM_MOE_DENSE_MIN_ROWS", "-5"},
                   {"ATOM_MOE_DENSE_MAX_SLOTS", "-1"},
                   {"ATOM_ATTENTION_BACKEND", "bogus"}});
    const CudaTuning t = CudaTuning::from_env();
    EXPECT_EQ(t.wgmma_warpgroups, 2);
    EXPECT_EQ(t.wgmma_pipeline, 6);
    EXPECT_EQ(t.fp8_skinny_rows, 0);
    EXPECT_EQ(t.moe_decode_max_rows, kMoeDecodeMaxRowsCap);
    EXPECT_EQ(t.moe_decode_max_rows_mxfp4, 0);
    EXPECT_EQ(t.moe_decode_depth, 2);
    EXPECT_EQ(t.moe_gemm_tile_rows, 0);
    EXPECT_EQ(t.moe_dense_min_rows, 0);
    EXPECT_EQ(t.moe_dense_max_slots, 0);
    EXPECT_EQ(t.attention_backend, PrefillAttention::kAuto);
  }
  {
    // ATOM_WGMMA_PIPELINE was read with atoi: text is 0, the serial loop.
    const Env env({{"ATOM_WGMMA_PIPELINE", "x"}});
    EXPECT_EQ(CudaTuning::from_env().wgmma_pipeline, 0);
  }
  CudaTuning t;
  t.wgmma_order_across = 7;
  EXPECT_EQ(t.normalized().wgmma_order_across, 1);
  t.wgmma_order_across = -9;
  EXPECT_EQ(t.normalized().wgmma_order_across, -1);
  t.wgmma_pipeline = 0;
  EXPECT_EQ(t.normalized().wgmma_pipeline, 0);
  // A malformed integer is an error naming the variable.
  const Env bad({{"ATOM_SKINNY_GEMM_MAX_M", "two"}});
  try {
    (void)CudaTuning::from_env();
    ADD_FAILURE() << "no error for ATOM_SKINNY_GEMM_MAX_M=two";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("ATOM_SKINNY_GEMM_MAX_M"), std::string::npos) << e.what();
  }
}

TEST(CudaTuning, ScopesNestAndEndWithTheirLifetime) {
  const CudaTuning& def = default_cuda_tuning();
  EXPECT_EQ(&cuda_tuning(), &def);
  {
    const CudaTuningScope a(cuda_tuning_with([](CudaTuning& t) { t.skinny_max_m = 4; }));
    EXPECT_EQ(cuda_tuning().skinny_max_m, 4);
    {
      const CudaTuningScope b(cuda_tuning_with([](CudaTuning& t) { t.moe_decode_depth = 4; }));
      EXPECT_EQ(cuda_tuning().skinny_max_m, 4);  // the enclosing scope's values carry over
      EXPECT_EQ(cuda_tuning().moe_decode_depth, 4);
    }
    EXPECT_EQ(cuda_tuning().moe_decode_depth, def.moe_decode_depth);
    EXPECT_EQ(cuda_tuning().skinny_max_m, 4);
  }
  EXPECT_EQ(&cuda_tuning(), &def);
  EXPECT_EQ(def, CudaTuning::from_env());  // the defaults never changed
  // A scope keeps its own normalized copy: changing the caller's object after changes nothing.
  CudaTuning mine;
  mine.wgmma_warpgroups = 5;
  const CudaTuningScope c(mine);
  mine.wgmma_warpgroups = 1;
  EXPECT_EQ(cuda_tuning().wgmma_warpgroups, 2);
}

// Two threads, each with its own tuning, running at the same time: neither sees the other's
// (the old setters wrote one global that both would have read).
TEST(CudaTuning, ScopesOnTwoThreadsDoNotAffectEachOther) {
  std::atomic<int> stage{0};
  auto wait_for = [&](int s) {
    while (stage.load() < s) std::this_thread::yield();
  };
  int seen_a_inside = -1, seen_a_after_b = -1, seen_b = -1, seen_b_after_a = -1;
  std::thread a([&] {
    const CudaTuningScope s(cuda_tuning_with([](CudaTuning& t) {
      t.skinny_max_m = 4;
      t.attention_backend = PrefillAttention::kSimple;
    }));
    seen_a_inside = cuda_tuning().skinny_max_m;
    stage = 1;
    wait_for(2);  // b has made its own scope
    seen_a_after_b = cuda_tuning().skinny_max_m;
    stage = 3;
    wait_for(4);
  });
  std::thread b([&] {
    wait_for(1);  // a's scope is live
    const CudaTuningScope s(cuda_tuning_with([](CudaTuning& t) { t.skinny_max_m = 0; }));
    seen_b = cuda_tuning().skinny_max_m;
    EXPECT_EQ(cuda_tuning().attention_backend, default_cuda_tuning().attention_backend);
    stage = 2;
    wait_for(3);
    seen_b_after_a = cuda_tuning().skinny_max_m;
    stage = 4;
  });
  a.join();
  b.join();
  EXPECT_EQ(seen_a_inside, 4);
  EXPECT_EQ(seen_a_after_b, 4);
  EXPECT_EQ(seen_b, 0);
  EXPECT_EQ(seen_b_after_a, 0);
  // This thread never had a scope.
  EXPECT_EQ(&cuda_tuning(), &default_cuda_tuning());
}

}  // namespace
}  // namespace atom::kernels::cuda
