// CUDA entry point of DeepSeek-V4.1's Engram gate (kernel in engram.cu).
#include "kernels/engram.h"

#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

void engram_gate_add(Tensor& streams, const Tensor& kv, const Tensor& k_weight,
                     const Tensor& q_weight, float eps) {
  engram_gate_check(streams, kv, k_weight, q_weight);
  EngramLaunch l;
  l.streams = streams.ptr<float>();
  l.kv = mat_of(kv, "engram_gate_add");
  l.k_weight = k_weight.ptr<float>();
  l.q_weight = q_weight.ptr<float>();
  l.tokens = streams.size(0);
  l.hc = static_cast<int>(streams.size(1));
  l.hidden = streams.size(2);
  l.eps = eps;
  launch_engram_gate(l, current_stream());
  launch_check("engram_gate_add");
}

}  // namespace atom::kernels::cuda
