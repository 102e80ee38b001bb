// CUDA entry point of DeepSeek-V4.1's index plane store (kernel in index_plane.cu).
#include "kernels/index_plane.h"

#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

void index_plane_store(Tensor& plane, Tensor& scales, const Tensor& keys, const Tensor& rows,
                       const Tensor& positions, const Tensor& inv_freq, const IndexStoreArgs& a) {
  index_plane_store_check(plane, scales, keys, rows, positions, inv_freq, a);
  ATOM_CHECK(a.head_dim * 4 <= 48 * 1024, "index_plane_store: keys of {} beyond the CUDA kernel's",
             a.head_dim);
  IndexStoreLaunch l;
  l.plane = plane.ptr<uint8_t>();
  l.scales = a.format == IndexKeyFormat::kFp4 ? scales.ptr<uint8_t>() : nullptr;
  l.keys = keys.ptr<float>();
  l.rows = rows.ptr<int32_t>();
  l.positions = positions.ptr<int32_t>();
  l.inv_freq = a.rot_dim > 0 ? inv_freq.ptr<float>() : nullptr;
  l.num_keys = keys.size(0);
  l.head_dim = a.head_dim;
  l.rot_dim = a.rot_dim;
  l.attention_factor = a.attention_factor;
  l.fp4 = a.format == IndexKeyFormat::kFp4;
  l.ratio = a.ratio;
  launch_index_plane_store(l, current_stream());
  launch_check("index_plane_store");
}

}  // namespace atom::kernels::cuda
