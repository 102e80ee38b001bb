// CUDA entry points of kernels/compressed_kv.h: shape and dtype checks, then compressed_kv.cu's
// launchers.
#include "kernels/compressed_kv.h"

#include "kernels/cuda/compressed_kv_launch.h"
#include "kernels/cuda/host_common.h"

namespace atom::kernels::cuda {

namespace {

bool is_i32_vec(const Tensor* t) {
  return t && t->defined() && t->dtype() == DType::kI32 && t->is_contiguous();
}

CkvBatch ckv_batch(const char* op, const CompressedBatch& b) {
  ATOM_CHECK(is_i32_vec(b.query_start) && is_i32_vec(b.context_lens) && is_i32_vec(b.page_indptr) &&
                 is_i32_vec(b.page_indices) &&
                 b.query_start->numel() == b.context_lens->numel() + 1 && b.block_size >= 1,
             "{}: the batch's query_start, context_lens, page_indptr and page_indices must be "
             "contiguous I32 (query_start one longer)",
             op);
  CkvBatch c;
  c.query_start = b.query_start->ptr<int32_t>();
  c.context_lens = b.context_lens->ptr<int32_t>();
  c.page_indptr = b.page_indptr->ptr<int32_t>();
  c.page_indices = b.page_indices->ptr<int32_t>();
  c.num_seqs = static_cast<int>(b.context_lens->numel());
  c.block_size = b.block_size;
  return c;
}

void check_plane(const char* op, const Tensor& plane, const char* name, int64_t width) {
  ATOM_CHECK(
      plane.dim() == 4 && plane.is_contiguous() && plane.size(2) == 1 && plane.size(3) == width,
      "{}: {} {} must be contiguous [num_pages, rows, 1, {}]", op, name, plane.str(), width);
}

void check_inv_freq(const char* op, const Tensor& inv_freq, int rot_dim) {
  ATOM_CHECK(rot_dim % 2 == 0 &&
                 (rot_dim == 0 || (inv_freq.dtype() == DType::kF32 && inv_freq.is_contiguous() &&
                                   inv_freq.numel() == rot_dim / 2)),
             "{}: inv_freq {} for {} rotary channels", op, inv_freq.str(), rot_dim);
}

}  // namespace

void heads_norm_rope(Tensor& x, const Tensor& inv_freq, const CompressedBatch& b,
                     const HeadsRopeArgs& a) {
  check_rows("heads_norm_rope", x, "x");
  ATOM_CHECK(a.heads >= 1 && a.head_dim >= 1 && a.rot_dim >= 0 && a.rot_dim <= a.head_dim &&
                 x.size(1) == static_cast<int64_t>(a.heads) * a.head_dim,
             "heads_norm_rope: x {} for {} heads of {} with {} rotary channels", x.str(), a.heads,
             a.head_dim, a.rot_dim);
  check_inv_freq("heads_norm_rope", inv_freq, a.rot_dim);
  ATOM_CHECK(is_i32_vec(b.positions) && b.positions->numel() == x.size(0),
             "heads_norm_rope: positions must be contiguous I32 [{}]", x.size(0));
  HeadsRopeLaunch l;
  l.x = mat_of(x, "heads_norm_rope");
  l.positions = b.positions->ptr<int32_t>();
  l.inv_freq = a.rot_dim ? inv_freq.ptr<float>() : nullptr;
  l.heads = a.heads;
  l.head_dim = a.head_dim;
  l.rot_dim = a.rot_dim;
  l.attention_factor = a.attention_factor;
  l.norm_eps = a.norm_eps;
  l.norm = a.norm;
  l.inverse = a.inverse;
  launch_heads_norm_rope(l, current_stream());
  launch_check("heads_norm_rope");
}

void window_pool(Tensor& plane, Tensor& state, Tensor& scratch, const Tensor& kv,
                 const Tensor& gate, const Tensor& ape, const Tensor& norm_w,
                 const Tensor& inv_freq, const CompressedBatch& b, const WindowPoolArgs& a) {
  const char* op = "window_pool";
  const int64_t D = a.head_dim, width = (a.overlap ? 2 : 1) * D, T = kv.size(0);
  check_rows(op, kv, "kv");
  ATOM_CHECK(D >= 1 && a.ratio >= 1 && kv.size(1) == width,
             "window_pool: kv {} for entries of {} (overlap {})", kv.str(), D, a.overlap);
  if (gate.defined()) {
    check_rows(op, gate, "gate");
    ATOM_CHECK(gate.shape() == kv.shape(), "window_pool: gate {} for kv {}", gate.str(), kv.str());
  }
  ATOM_CHECK(!ape.defined() || (ape.dtype() == DType::kF32 && ape.is_contiguous() &&
                                ape.numel() == a.ratio * width),
             "window_pool: ape {} must be F32 [{}, {}]", ape.str(), a.ratio, width);
  ATOM_CHECK(norm_w.dtype() == DType::kF32 && norm_w.is_contiguous() && norm_w.numel() == D,
             "window_pool: norm weight {} must be F32 [{}]", norm_w.str(), D);
  check_inv_freq(op, inv_freq, a.rot_dim);
  check_plane(op, plane, "plane", D);
  ATOM_CHECK(state.dtype() == DType::kF32 && state.is_contiguous() && state.dim() == 4 &&
                 state.size(1) == (a.overlap ? 2 : 1) && state.size(2) == 3 && state.size(3) == D,
             "window_pool: state {} must be F32 [slots, {}, 3, {}]", state.str(), a.overlap ? 2 : 1,
             D);
  ATOM_CHECK(scratch.dtype() == DType::kF32 && scratch.is_contiguous() && scratch.numel() >= T * D,
             "window_pool: scratch {} must be F32 of at least {} x {}", scratch.str(), T, D);
  ATOM_CHECK(is_i32_vec(b.state_slots) && b.state_slots->numel() == b.context_lens->numel(),
             "window_pool: the batch needs a state slot per sequence");
  ATOM_CHECK(b.block_size % a.ratio == 0 || a.ratio % b.block_size == 0,
             "window_pool: windows of {} tokens in pages of {}: neither divides the other", a.ratio,
             b.block_size);
  WindowPoolLaunch l;
  l.b = ckv_batch(op, b);
  l.b.state_slots = b.state_slots->ptr<int32_t>();
  if (b.rollback_slots && b.rollback_slots->defined() && b.rollback_slots->numel() > 0) {
    ATOM_CHECK(is_i32_vec(b.rollback_slots) && b.rollback_slots->numel() == T,
               "window_pool: rollback slots {} for {} rows", b.rollback_slots->str(), T);
    l.b.rollback_slots = b.rollback_slots->ptr<int32_t>();
  }
  l.plane = plane.data();
  l.plane_type = elem_of(plane.dtype(), op);
  l.rows_per_page = static_cast<int>(plane.size(1));
  l.keep_latent = a.keep_latent;
  l.state = state.ptr<float>();
  l.scratch = scratch.ptr<float>();
  l.kv = mat_of(kv, op);
  if (gate.defined()) l.gate = mat_of(gate, op);
  l.ape = ape.defined() ? ape.ptr<float>() : nullptr;
  l.norm_w = norm_w.ptr<float>();
  l.inv_freq = a.rot_dim ? inv_freq.ptr<float>() : nullptr;
  l.head_dim = a.head_dim;
  l.ratio = a.ratio;
  l.overlap = a.overlap;
  l.rot_dim = a.rot_dim;
  l.attention_factor = a.attention_factor;
  l.norm_eps = a.norm_eps;
  l.num_tokens = T;
  launch_window_pool(l, current_stream());
  launch_check(op);
}

void sink_attention(Tensor& out, const Tensor& q, const Tensor& raw, const Tensor& entries,
                    const Tensor& topk, const Tensor& sinks, const CompressedBatch& b,
                    const SinkAttentionArgs& a) {
  const char* op = "sink_attention";
  check_rows(op, out, "out");
  check_rows(op, q, "q");
  const int64_t D = a.head_dim, T = q.size(0);
  ATOM_CHECK(a.heads >= 1 && D >= 1 && D <= kSinkMaxHeadDim && a.window >= 1 &&
                 q.size(1) == a.heads * D && out.shape() == q.shape(),
             "sink_attention: q {} out {} for {} heads of {} (the CUDA kernel takes heads up to "
             "{} wide)",
             q.str(), out.str(), a.heads, D, kSinkMaxHeadDim);
  check_plane(op, raw, "raw rows", D);
  ATOM_CHECK(raw.size(1) == b.block_size, "sink_attention: raw rows {} for pages of {}", raw.str(),
             b.block_size);
  ATOM_CHECK(sinks.dtype() == DType::kF32 && sinks.is_contiguous() && sinks.numel() == a.heads,
             "sink_attention: sinks {} must be F32 [{}]", sinks.str(), a.heads);
  if (entries.defined()) {
    check_plane(op, entries, "entries", D);
    ATOM_CHECK(entries.dtype() == raw.dtype() && a.ratio >= 1,
               "sink_attention: entries {} beside raw rows {}, windows of {}", entries.str(),
               raw.str(), a.ratio);
  }
  ATOM_CHECK(!topk.defined() || (entries.defined() && topk.dtype() == DType::kI32 &&
                                 topk.is_contiguous() && topk.dim() == 2 && topk.size(0) == T),
             "sink_attention: topk {} must be contiguous I32 [{}, K] over entries", topk.str(), T);
  SinkAttentionLaunch l;
  l.b = ckv_batch(op, b);
  l.out = mat_of(out, op);
  l.q = mat_of(q, op);
  l.raw = raw.data();
  l.entries = entries.defined() ? entries.data() : nullptr;
  l.cache_type = elem_of(raw.dtype(), op);
  l.entry_rows_per_page = entries.defined() ? static_cast<int>(entries.size(1)) : 1;
  l.topk = topk.defined() ? topk.ptr<int32_t>() : nullptr;
  l.top_k = topk.defined() ? static_cast<int>(topk.size(1)) : 0;
  l.sinks = sinks.ptr<float>();
  l.heads = a.heads;
  l.head_dim = a.head_dim;
  l.window = a.window;
  l.ratio = entries.defined() ? a.ratio : 0;
  l.scale = a.scale;
  l.num_tokens = T;
  launch_sink_attention(l, current_stream());
  launch_check(op);
}

void gather_table_rows(Tensor& out, const Tensor& token_ids, const Tensor& table) {
  ATOM_CHECK(out.dtype() == DType::kI32 && out.is_contiguous() && out.dim() == 2 &&
                 table.dtype() == DType::kI32 && table.is_contiguous() && table.dim() == 2 &&
                 token_ids.dtype() == DType::kI32 && token_ids.is_contiguous() &&
                 token_ids.numel() == out.size(0) && out.size(1) == table.size(1),
             "gather_table_rows: out {} ids {} table {}", out.str(), token_ids.str(), table.str());
  launch_gather_table_rows(out.ptr<int32_t>(), token_ids.ptr<int32_t>(), table.ptr<int32_t>(),
                           out.size(0), table.size(0), static_cast<int>(table.size(1)),
                           current_stream());
  launch_check("gather_table_rows");
}

}  // namespace atom::kernels::cuda
