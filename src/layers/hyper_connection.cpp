#include "layers/hyper_connection.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace atom {

namespace {

void check_streams(const Tensor& x, const HyperConnectionOptions& o, const char* what) {
  ATOM_CHECK(x.device().is_cpu() && x.dtype() == DType::kF32 && x.is_contiguous() && x.dim() == 3 &&
                 x.size(1) == o.hc_mult && x.size(2) == o.hidden,
             "{}: streams {} must be contiguous F32 [T, {}, {}] on the CPU (hyper-connections run "
             "on the CPU only so far)",
             what, x.str(), o.hc_mult, o.hidden);
}

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

}  // namespace

HyperConnection::HyperConnection(LayerContext& ctx, const std::string& fn, const std::string& base,
                                 const std::string& scale, const HyperConnectionOptions& o)
    : o_(o) {
  const int64_t hc = o.hc_mult, mix = (2 + hc) * hc;
  ATOM_CHECK(hc >= 1 && o.hidden >= 1 && o.sinkhorn_iters >= 1,
             "{}: hyper-connections need hc_mult >= 1 and hc_sinkhorn_iters >= 1 (got {}, {})", fn,
             hc, o.sinkhorn_iters);
  fn_ = &ctx.params.add(fn, ctx.param_tensor({mix, hc * o.hidden}, DType::kF32));
  base_ = &ctx.params.add(base, ctx.param_tensor({mix}, DType::kF32));
  scale_ = &ctx.params.add(scale, ctx.param_tensor({3}, DType::kF32));
}

HyperConnection::Mix HyperConnection::mix(Step& step, const Tensor& x) const {
  check_streams(x, o_, "hyper-connection");
  const int64_t T = x.size(0), hc = o_.hc_mult, D = o_.hidden, rows = (2 + hc) * hc;
  Mix m{step.empty({T, D}, DType::kF32), step.empty({T, hc}, DType::kF32),
        step.empty({T, hc, hc}, DType::kF32)};
  const float* fn = fn_->data().ptr<float>();
  const float* base = base_->data().ptr<float>();
  const float* scale = scale_->data().ptr<float>();
  const float eps = o_.hc_eps;
#pragma omp parallel for schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x.ptr<float>() + t * hc * D;
    std::vector<float> mv(static_cast<size_t>(rows)), pre(static_cast<size_t>(hc));
    mixes(xt, hc * D, fn, rows, o_.norm_eps, mv.data());
    float* post = m.post.ptr<float>() + t * hc;
    float* comb = m.comb.ptr<float>() + t * hc * hc;
    for (int64_t j = 0; j < hc; ++j) {
      pre[j] = sigmoid(mv[j] * scale[0] + base[j]) + eps;
      post[j] = 2.0f * sigmoid(mv[hc + j] * scale[1] + base[hc + j]);
    }
    for (int64_t i = 0; i < hc; ++i) {  // softmax over each row, + eps
      float* row = comb + i * hc;
      float mx = -INFINITY;
      for (int64_t j = 0; j < hc; ++j) {
        row[j] = mv[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j];
        mx = std::max(mx, row[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < hc; ++j) sum += (row[j] = std::exp(row[j] - mx));
      for (int64_t j = 0; j < hc; ++j) row[j] = row[j] / sum + eps;
    }
    auto normalise_columns = [&] {
      for (int64_t j = 0; j < hc; ++j) {
        float s = 0;
        for (int64_t i = 0; i < hc; ++i) s += comb[i * hc + j];
        for (int64_t i = 0; i < hc; ++i) comb[i * hc + j] /= s + eps;
      }
    };
    normalise_columns();
    for (int it = 1; it < o_.sinkhorn_iters; ++it) {
      for (int64_t i = 0; i < hc; ++i) {
        float s = 0;
        for (int64_t j = 0; j < hc; ++j) s += comb[i * hc + j];
        for (int64_t j = 0; j < hc; ++j) comb[i * hc + j] /= s + eps;
      }
      normalise_columns();
    }
    float* in = m.input.ptr<float>() + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0;
      for (int64_t j = 0; j < hc; ++j) acc += pre[j] * xt[j * D + d];
      in[d] = acc;
    }
  }
  return m;
}

void HyperConnection::write_back(const Mix& m, const Tensor& y, Tensor& x) {
  const int64_t T = x.size(0), hc = x.size(1), D = x.size(2);
  ATOM_CHECK(y.device().is_cpu() && y.dtype() == DType::kF32 && y.is_contiguous() &&
                 y.shape() == Shape({T, D}),
             "hyper-connection: sublayer output {} for streams {}", y.str(), x.str());
#pragma omp parallel for schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    float* xt = x.ptr<float>() + t * hc * D;
    const float* post = m.post.ptr<float>() + t * hc;
    const float* comb = m.comb.ptr<float>() + t * hc * hc;
    const float* yt = y.ptr<float>() + t * D;
    std::vector<float> old(xt, xt + hc * D);
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t d = 0; d < D; ++d) {
        float acc = post[k] * yt[d];
        for (int64_t j = 0; j < hc; ++j) acc += comb[j * hc + k] * old[j * D + d];
        xt[k * D + d] = acc;
      }
  }
}

Tensor hc_streams_from_embedding(Step& step, const Tensor& e, int64_t hc) {
  ATOM_CHECK(e.device().is_cpu() && e.dtype() == DType::kF32 && e.is_contiguous() && e.dim() == 2,
             "hyper-connections: embeddings {} must be contiguous F32 on the CPU (they run on the "
             "CPU only so far)",
             e.str());
  const int64_t T = e.size(0), D = e.size(1);
  Tensor streams = step.empty({T, hc, D}, DType::kF32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hc; ++j)
      std::copy_n(e.ptr<float>() + t * D, D, streams.ptr<float>() + (t * hc + j) * D);
  return streams;
}

Tensor hc_streams_from_stage(Step& step, int64_t hc, int64_t hidden) {
  const Tensor* in = step.pp_in ? &step.pp_in->hidden : nullptr;
  ATOM_CHECK(in && in->defined() && in->dim() == 3 && in->size(0) == step.batch.num_tokens() &&
                 in->size(1) == hc && in->size(2) == hidden && in->dtype() == DType::kF32,
             "hyper-connections: the previous pipeline stage handed on {}, not the [{}, {}, {}] "
             "F32 streams",
             in && in->defined() ? in->str() : std::string("nothing"), step.batch.num_tokens(), hc,
             hidden);
  return *in;
}

HyperHead::HyperHead(LayerContext& ctx, const std::string& fn, const std::string& base,
                     const std::string& scale, const HyperConnectionOptions& o)
    : o_(o) {
  const int64_t hc = o.hc_mult;
  fn_ = &ctx.params.add(fn, ctx.param_tensor({hc, hc * o.hidden}, DType::kF32));
  base_ = &ctx.params.add(base, ctx.param_tensor({hc}, DType::kF32));
  scale_ = &ctx.params.add(scale, ctx.param_tensor({1}, DType::kF32));
}

Tensor HyperHead::forward(Step& step, const Tensor& x) const {
  check_streams(x, o_, "hyper-connection head");
  const int64_t T = x.size(0), hc = o_.hc_mult, D = o_.hidden;
  Tensor out = step.empty({T, D}, DType::kF32);
#pragma omp parallel for schedule(static) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x.ptr<float>() + t * hc * D;
    std::vector<float> w(static_cast<size_t>(hc), 1.0f / static_cast<float>(hc));
    if (fn_) {
      mixes(xt, hc * D, fn_->data().ptr<float>(), hc, o_.norm_eps, w.data());
      const float s = scale_->data().ptr<float>()[0];
      for (int64_t j = 0; j < hc; ++j)
        w[j] = sigmoid(w[j] * s + base_->data().ptr<float>()[j]) + o_.hc_eps;
    }
    float* o = out.ptr<float>() + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0;
      for (int64_t j = 0; j < hc; ++j) acc += w[j] * xt[j * D + d];
      o[d] = acc;
    }
  }
  return out;
}

}  // namespace atom
