// The CPU reference of the hyper-connection maps (kernels/hyper_connection.h): fp32 math, the
// streams F32, the sublayer's input and output in any float dtype.
#include "kernels/hyper_connection.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

namespace {

// f · rsqrt(mean(f²) + eps) of one token's flattened streams, then m = f · fnᵀ (rows of fn).
void mixes(const float* x, int64_t n, const float* fn, int64_t rows, float eps, float* m) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t k = 0; k < rows; ++k) {
    const float* w = fn + k * n;
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i] * r) * w[i];
    m[k] = static_cast<float>(acc);
  }
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// out[t] = Σ_j w_j x_j of one token, stored in out's dtype.
void collapse(Tensor& out, int64_t t, const float* xt, const float* w, int64_t hc, int64_t D) {
  char* o = row_ptr(out, t);
  for (int64_t d = 0; d < D; ++d) {
    float acc = 0;
    for (int64_t j = 0; j < hc; ++j) acc += w[j] * xt[j * D + d];
    store(o, out.dtype(), d, acc);
  }
}

}  // namespace

void hc_mix(Tensor& input, Tensor& post, Tensor& comb, const Tensor& x, const Tensor& fn,
            const Tensor& base, const Tensor& scale, const HcArgs& a, const HcCarry& carry) {
  hc_checks::mix(input, post, comb, x, fn, base, scale, a);
  hc_checks::carry(carry, x);
  const int64_t T = x.size(0), hc = a.hc, D = x.size(2), rows = (2 + hc) * hc;
  const float* f = fn.ptr<float>();
  const float* bs = base.ptr<float>();
  const float* sc = scale.ptr<float>();
  const float eps = a.hc_eps;
#pragma omp parallel for schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x.ptr<float>() + t * hc * D;
    std::vector<float> mv(static_cast<size_t>(rows)), pre(static_cast<size_t>(hc));
    mixes(xt, hc * D, f, rows, a.norm_eps, mv.data());
    float* pt = post.ptr<float>() + t * hc;
    float* cb = comb.ptr<float>() + t * hc * hc;
    for (int64_t j = 0; j < hc; ++j) {
      pre[j] = sigmoid(mv[j] * sc[0] + bs[j]) + eps;
      pt[j] = 2.0f * sigmoid(mv[hc + j] * sc[1] + bs[hc + j]);
    }
    for (int64_t i = 0; i < hc; ++i) {  // softmax over each row, + eps
      float* row = cb + i * hc;
      float mx = -INFINITY;
      for (int64_t j = 0; j < hc; ++j) {
        row[j] = mv[2 * hc + i * hc + j] * sc[2] + bs[2 * hc + i * hc + j];
        mx = std::max(mx, row[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < hc; ++j) sum += (row[j] = std::exp(row[j] - mx));
      for (int64_t j = 0; j < hc; ++j) row[j] = row[j] / sum + eps;
    }
    auto normalise_columns = [&] {
      for (int64_t j = 0; j < hc; ++j) {
        float s = 0;
        for (int64_t i = 0; i < hc; ++i) s += cb[i * hc + j];
        for (int64_t i = 0; i < hc; ++i) cb[i * hc + j] /= s + eps;
      }
    };
    normalise_columns();
    for (int it = 1; it < a.sinkhorn_iters; ++it) {
      for (int64_t i = 0; i < hc; ++i) {
        float s = 0;
        for (int64_t j = 0; j < hc; ++j) s += cb[i * hc + j];
        for (int64_t j = 0; j < hc; ++j) cb[i * hc + j] /= s + eps;
      }
      normalise_columns();
    }
    if (carry.pre_out) std::copy(pre.begin(), pre.end(), carry.pre_out->ptr<float>() + t * hc);
    collapse(input, t, xt, carry.by ? carry.by->ptr<float>() + t * hc : pre.data(), hc, D);
  }
}

void hc_collapse(Tensor& out, const Tensor& x, const Tensor& by) {
  hc_checks::collapse(out, x, by);
  const int64_t T = x.size(0), hc = x.size(1), D = x.size(2);
#pragma omp parallel for schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t)
    collapse(out, t, x.ptr<float>() + t * hc * D, by.ptr<float>() + t * hc, hc, D);
}

void hc_write_back(Tensor& x, const Tensor& y, const Tensor& post, const Tensor& comb) {
  hc_checks::write_back(x, y, post, comb);
  const int64_t T = x.size(0), hc = x.size(1), D = x.size(2);
#pragma omp parallel for schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    float* xt = x.ptr<float>() + t * hc * D;
    const float* pt = post.ptr<float>() + t * hc;
    const float* cb = comb.ptr<float>() + t * hc * hc;
    const char* yt = row_ptr(y, t);
    std::vector<float> old(xt, xt + hc * D);
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t d = 0; d < D; ++d) {
        float acc = pt[k] * load(yt, y.dtype(), d);
        for (int64_t j = 0; j < hc; ++j) acc += cb[j * hc + k] * old[j * D + d];
        xt[k * D + d] = acc;
      }
  }
}

void hc_head(Tensor& out, const Tensor& x, const Tensor& fn, const Tensor& base,
             const Tensor& scale, const HcArgs& a) {
  hc_checks::head(out, x, fn, base, scale, a);
  const int64_t T = x.size(0), hc = a.hc, D = x.size(2);
#pragma omp parallel for schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x.ptr<float>() + t * hc * D;
    std::vector<float> w(static_cast<size_t>(hc), 1.0f / static_cast<float>(hc));
    if (fn.defined()) {
      mixes(xt, hc * D, fn.ptr<float>(), hc, a.norm_eps, w.data());
      const float s = scale.ptr<float>()[0];
      for (int64_t j = 0; j < hc; ++j) w[j] = sigmoid(w[j] * s + base.ptr<float>()[j]) + a.hc_eps;
    }
    collapse(out, t, xt, w.data(), hc, D);
  }
}

void hc_expand(Tensor& x, const Tensor& e) {
  hc_checks::expand(x, e);
  const int64_t T = x.size(0), hc = x.size(1), D = x.size(2);
  for (int64_t t = 0; t < T; ++t) {
    float* xt = x.ptr<float>() + t * hc * D;
    load_span(row_ptr(e, t), e.dtype(), 0, D, xt);
    for (int64_t j = 1; j < hc; ++j) std::copy_n(xt, D, xt + j * D);
  }
}

}  // namespace atom::kernels::cpu
