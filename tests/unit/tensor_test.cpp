#include <gtest/gtest.h>

#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"

namespace atom {

TEST(Tensor, EmptyViewNarrowSelect) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::kF32);
  float* p = t.ptr<float>();
  for (int i = 0; i < 24; ++i) p[i] = static_cast<float>(i);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.size(1), 4);
  Tensor n = t.narrow(2, 1, 2);
  EXPECT_FALSE(n.is_contiguous());
  Tensor c = n.contiguous();
  EXPECT_EQ(c.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(c.ptr<float>()[0], 1.0f);
  EXPECT_EQ(c.ptr<float>()[1], 2.0f);
  EXPECT_EQ(c.ptr<float>()[2], 5.0f);
  Tensor s = t.select(0, 1);
  EXPECT_EQ(s.shape(), (Shape{3, 4}));
  EXPECT_EQ(s.ptr<float>()[0], 12.0f);
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.narrow(1, 2, 2), Error);
}

TEST(Half, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 65504.0f, 1e-20f}) {
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(f)))), bf16_to_f32(f32_to_bf16(f)));
  }
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);
}

TEST(Half, F16RoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 0.1f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f}) {
    const float g = f16_to_f32(f32_to_f16(f));
    EXPECT_NEAR(g, f, std::abs(f) * 1e-3f + 1e-12f) << f;
  }
}

}  // namespace atom
