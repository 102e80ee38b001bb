// CUDA entry points of the hyper-connection maps (kernels in hyper_connection.cu).
#include "kernels/hyper_connection.h"

#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

static_assert(kHcMaxStreams == kHcLaunchMaxStreams);

namespace {

// The CUDA kernels' own limit, after the shared checks.
void check_stream_count(const char* op, int64_t hc) {
  ATOM_CHECK(hc >= 1 && hc <= kHcMaxStreams, "{}: {} streams: the CUDA kernels take 1 to {}", op,
             hc, kHcMaxStreams);
}

HcLaunch collapse_launch(Tensor& out, const Tensor& x, const HcArgs& a, const char* op) {
  check_stream_count(op, a.hc);
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
            const Tensor& base, const Tensor& scale, const HcArgs& a, const HcCarry& carry) {
  hc_checks::mix(input, post, comb, x, fn, base, scale, a);
  hc_checks::carry(carry, x);
  const int64_t rows = (2 + int64_t{a.hc}) * a.hc;
  HcLaunch l = collapse_launch(input, x, a, "hc_mix");
  l.fn = fn.ptr<float>();
  l.base = base.ptr<float>();
  l.scale = scale.ptr<float>();
  l.rows = static_cast<int>(rows);
  l.post = post.ptr<float>();
  l.comb = comb.ptr<float>();
  l.by = carry.by ? carry.by->ptr<float>() : nullptr;
  l.pre_out = carry.pre_out ? carry.pre_out->ptr<float>() : nullptr;
  launch_hc_collapse(l, current_stream());
  launch_check("hc_mix");
}

void hc_collapse(Tensor& out, const Tensor& x, const Tensor& by) {
  hc_checks::collapse(out, x, by);
  HcArgs a;
  a.hc = static_cast<int>(x.size(1));
  HcLaunch l = collapse_launch(out, x, a, "hc_collapse");
  l.by = by.ptr<float>();
  launch_hc_collapse(l, current_stream());
  launch_check("hc_collapse");
}

void hc_write_back(Tensor& x, const Tensor& y, const Tensor& post, const Tensor& comb) {
  hc_checks::write_back(x, y, post, comb);
  const int64_t T = x.size(0), hc = x.size(1), D = x.size(2);
  check_stream_count("hc_write_back", hc);
  launch_hc_write_back(x.ptr<float>(), T, static_cast<int>(hc), D, mat_of(y, "hc_write_back"),
                       post.ptr<float>(), comb.ptr<float>(), current_stream());
  launch_check("hc_write_back");
}

void hc_head(Tensor& out, const Tensor& x, const Tensor& fn, const Tensor& base,
             const Tensor& scale, const HcArgs& a) {
  hc_checks::head(out, x, fn, base, scale, a);
  HcLaunch l = collapse_launch(out, x, a, "hc_head");
  if (fn.defined()) {
    l.fn = fn.ptr<float>();
    l.base = base.ptr<float>();
    l.scale = scale.ptr<float>();
    l.rows = a.hc;
  }
  launch_hc_collapse(l, current_stream());
  launch_check("hc_head");
}

void hc_expand(Tensor& x, const Tensor& e) {
  hc_checks::expand(x, e);
  check_stream_count("hc_expand", x.size(1));
  launch_hc_expand(x.ptr<float>(), x.size(0), static_cast<int>(x.size(1)), x.size(2),
                   mat_of(e, "hc_expand"), current_stream());
  launch_check("hc_expand");
}

}  // namespace atom::kernels::cuda
