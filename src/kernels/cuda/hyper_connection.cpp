// CUDA entry points of the hyper-connection maps (kernels in hyper_connection.cu).
#include "kernels/hyper_connection.h"

#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

static_assert(kHcMaxStreams == kHcLaunchMaxStreams);

namespace {

void check_streams(const char* op, const Tensor& x, int hc) {
  ATOM_CHECK(x.dtype() == DType::kF32 && x.is_contiguous() && x.dim() == 3 && x.size(1) == hc,
             "{}: streams {} must be contiguous F32 [T, {}, D]", op, x.str(), hc);
  ATOM_CHECK(hc >= 1 && hc <= kHcMaxStreams, "{}: {} streams: the CUDA kernels take 1 to {}", op,
             hc, kHcMaxStreams);
}

void check_params(const char* op, const Tensor& fn, const Tensor& base, const Tensor& scale,
                  int64_t rows, int64_t n, int64_t scales) {
  ATOM_CHECK(fn.dtype() == DType::kF32 && fn.is_contiguous() && fn.shape() == Shape({rows, n}) &&
                 base.dtype() == DType::kF32 && base.numel() == rows && base.is_contiguous() &&
                 scale.dtype() == DType::kF32 && scale.numel() == scales,
             "{}: fn {} base {} scale {}: expected F32 [{}, {}], [{}], [{}]", op, fn.str(),
             base.str(), scale.str(), rows, n, rows, scales);
}

HcLaunch collapse_launch(Tensor& out, const Tensor& x, const HcArgs& a, const char* op) {
  check_rows(op, out, "out");
  ATOM_CHECK(out.shape() == Shape({x.size(0), x.size(2)}), "{}: out {} for streams {}", op,
             out.str(), x.str());
  HcLaunch l;
  l.x = x.ptr<float>();
  l.tokens = x.size(0);
  l.dim = x.size(2);
  l.hc = a.hc;
  l.out = mat_of(out, op);
  l.sinkhorn_iters = a.sinkhorn_iters;
  l.hc_eps = a.hc_eps;
  l.norm_eps = a.norm_eps;
  return l;
}

}  // namespace

void hc_mix(Tensor& input, Tensor& post, Tensor& comb, const Tensor& x, const Tensor& fn,
            const Tensor& base, const Tensor& scale, const HcArgs& a) {
  check_streams("hc_mix", x, a.hc);
  const int64_t T = x.size(0), hc = a.hc, D = x.size(2), rows = (2 + hc) * hc;
  check_params("hc_mix", fn, base, scale, rows, hc * D, 3);
  ATOM_CHECK(post.dtype() == DType::kF32 && post.is_contiguous() &&
                 post.shape() == Shape({T, hc}) && comb.dtype() == DType::kF32 &&
                 comb.is_contiguous() && comb.shape() == Shape({T, hc, hc}) &&
                 a.sinkhorn_iters >= 1,
             "hc_mix: post {} comb {} for streams {} ({} Sinkhorn iterations)", post.str(),
             comb.str(), x.str(), a.sinkhorn_iters);
  HcLaunch l = collapse_launch(input, x, a, "hc_mix");
  l.fn = fn.ptr<float>();
  l.base = base.ptr<float>();
  l.scale = scale.ptr<float>();
  l.rows = static_cast<int>(rows);
  l.post = post.ptr<float>();
  l.comb = comb.ptr<float>();
  launch_hc_collapse(l, current_stream());
  launch_check("hc_mix");
}

void hc_write_back(Tensor& x, const Tensor& y, const Tensor& post, const Tensor& comb) {
  ATOM_CHECK(x.dim() == 3, "hc_write_back: streams {} must be [T, hc, D]", x.str());
  const int64_t T = x.size(0), hc = x.size(1), D = x.size(2);
  check_streams("hc_write_back", x, static_cast<int>(hc));
  check_rows("hc_write_back", y, "y");
  ATOM_CHECK(y.shape() == Shape({T, D}) && post.dtype() == DType::kF32 && post.is_contiguous() &&
                 post.shape() == Shape({T, hc}) && comb.dtype() == DType::kF32 &&
                 comb.is_contiguous() && comb.shape() == Shape({T, hc, hc}),
             "hc_write_back: sublayer output {} post {} comb {} for streams {}", y.str(),
             post.str(), comb.str(), x.str());
  launch_hc_write_back(x.ptr<float>(), T, static_cast<int>(hc), D, mat_of(y, "hc_write_back"),
                       post.ptr<float>(), comb.ptr<float>(), current_stream());
  launch_check("hc_write_back");
}

void hc_head(Tensor& out, const Tensor& x, const Tensor& fn, const Tensor& base,
             const Tensor& scale, const HcArgs& a) {
  check_streams("hc_head", x, a.hc);
  HcLaunch l = collapse_launch(out, x, a, "hc_head");
  if (fn.defined()) {
    check_params("hc_head", fn, base, scale, a.hc, a.hc * x.size(2), 1);
    l.fn = fn.ptr<float>();
    l.base = base.ptr<float>();
    l.scale = scale.ptr<float>();
    l.rows = a.hc;
  }
  launch_hc_collapse(l, current_stream());
  launch_check("hc_head");
}

void hc_expand(Tensor& x, const Tensor& e) {
  ATOM_CHECK(x.dim() == 3, "hc_expand: streams {} must be [T, hc, D]", x.str());
  check_streams("hc_expand", x, static_cast<int>(x.size(1)));
  check_rows("hc_expand", e, "e");
  ATOM_CHECK(e.shape() == Shape({x.size(0), x.size(2)}), "hc_expand: embeddings {} for streams {}",
             e.str(), x.str());
  launch_hc_expand(x.ptr<float>(), x.size(0), static_cast<int>(x.size(1)), x.size(2),
                   mat_of(e, "hc_expand"), current_stream());
  launch_check("hc_expand");
}

}  // namespace atom::kernels::cuda
