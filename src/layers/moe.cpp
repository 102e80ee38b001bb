#include "layers/moe.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/convert.h"
#ifdef ATOM_HAVE_CUDA
#include "core/cuda_stream.h"
#endif
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/random.h"

#include <cmath>
#include <cstring>

namespace atom {

std::vector<ExpertParamMapping> fused_moe_expert_mapping(const std::string& gate,
                                                         const std::string& down,
                                                         const std::string& up,
                                                         int64_t num_experts) {
  std::vector<ExpertParamMapping> m;
  for (int64_t e = 0; e < num_experts; ++e) {
    const std::string at = "experts." + std::to_string(e) + ".";
    const int id = static_cast<int>(e);
    m.push_back({"experts.w13_", at + gate + ".", id, "w1"});
    m.push_back({"experts.w2_", at + down + ".", id, "w2"});
    m.push_back({"experts.w13_", at + up + ".", id, "w3"});
  }
  return m;
}

std::vector<ExpertParamMapping> fused_moe_mxfp4_pack_mapping(
    const std::string& gate, const std::string& down, const std::string& up, int64_t num_experts,
    const std::string& values, const std::string& scales) {
  // fused_moe_expert_mapping's entries, each projection's two tensors apart.
  std::vector<ExpertParamMapping> m;
  for (const ExpertParamMapping& e : fused_moe_expert_mapping(gate, down, up, num_experts)) {
    const std::string param = e.shard == "w2" ? "experts.w2_weight" : "experts.w13_weight";
    const std::string part = std::string("ct_mxfp4_") + (e.shard == "w1"   ? "gate"
                                                         : e.shard == "w3" ? "up"
                                                                           : "down");
    m.push_back({param, e.ckpt + values, e.expert, part + "_packed"});
    m.push_back({param, e.ckpt + scales, e.expert, part + "_scale"});
  }
  return m;
}

namespace {
// One layer's experts' MXFP4 tensors until each projection is whole.
struct Mxfp4PackBuffer {
  std::mutex mu;
  struct Expert {
    Tensor t[6];  // gate packed, gate scale, up packed, up scale, down packed, down scale
  };
  std::map<int, Expert> experts;
};

// rows [r, K/2] + rows [r, K/2] -> [2r, K/2] (and the scales alike): the gate's rows, then the
// up's.
Tensor stack_rows(const Tensor& a, const Tensor& b) {
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  Tensor out = Tensor::empty({ac.size(0) + bc.size(0), ac.size(1)}, ac.dtype());
  std::memcpy(out.data(), ac.data(), ac.nbytes());
  std::memcpy(static_cast<char*>(out.data()) + ac.nbytes(), bc.data(), bc.nbytes());
  return out;
}
}  // namespace

std::map<std::string, FusedMoEStackedFormat> fused_moe_mxfp4_pack_formats() {
  auto buf = std::make_shared<Mxfp4PackBuffer>();
  std::map<std::string, FusedMoEStackedFormat> f;
  const char* names[6] = {"gate_packed", "gate_scale",  "up_packed",
                          "up_scale",    "down_packed", "down_scale"};
  for (int slot = 0; slot < 6; ++slot)
    f[std::string("ct_mxfp4_") + names[slot]] = [buf, slot](FusedMoEWriter& w, const Tensor& t,
                                                            int e) {
      ATOM_CHECK(e >= 0, "MXFP4 expert tensor without an expert index");
      // Values are U8 (compressed-tensors) or I8 (DeepSeek's float4_e2m1fn_x2), scales U8 or
      // F8_E8M0: the same bytes either way.
      const bool scale = slot % 2 == 1;
      const bool byte_ok =
          t.dtype() == DType::kU8 || (scale ? t.dtype() == DType::kE8M0 : t.dtype() == DType::kI8);
      if (!byte_ok || t.dim() != 2)
        fail("MXFP4 expert {} tensor {}: expected {}", e, t.str(),
             scale ? "[rows, K/32] scales (U8 or F8_E8M0)" : "[rows, K/2] values (U8 or I8)");
      const bool down = slot >= 4;
      Tensor packed, scales;
      {
        std::lock_guard<std::mutex> lock(buf->mu);
        Mxfp4PackBuffer::Expert& x = buf->experts[e];
        x.t[slot] = Tensor::empty(t.shape(), DType::kU8);
        std::memcpy(x.t[slot].data(), t.contiguous().data(), t.nbytes());
        const int first = down ? 4 : 0, n = down ? 2 : 4;
        for (int i = first; i < first + n; ++i)
          if (!x.t[i].defined()) return;  // its partners have not come yet
        // Each projection's scales against its own values, so the error names the projection.
        for (int i = first; i < first + n; i += 2) {
          const Tensor &v = x.t[i], &sc = x.t[i + 1];
          if (v.size(1) % 16 != 0 || sc.shape() != Shape{v.size(0), v.size(1) / 16})
            fail("MXFP4 expert {} {}: scales {} do not pair with values {} (scales [rows, K/32] "
                 "for values [rows, K/2])",
                 e,
                 i == 0   ? "gate"
                 : i == 2 ? "up"
                          : "down",
                 shape_str(sc.shape()), shape_str(v.shape()));
        }
        if (down) {
          packed = x.t[4];
          scales = x.t[5];
        } else {
          packed = stack_rows(x.t[0], x.t[2]);
          scales = stack_rows(x.t[1], x.t[3]);
        }
        for (int i = first; i < first + n; ++i) x.t[i] = Tensor();
      }
      const int64_t rows = packed.size(0), k = packed.size(1) * 2;
      if (k % 32 != 0 || scales.shape() != Shape{rows, k / 32})
        fail("MXFP4 expert {}: values {} and scales {} do not pair (scales [rows, K/32])", e,
             packed.str(), scales.str());
      const Tensor blocks = packed.view({rows, k / 32, 16});
      if (down) {
        w.down_mxfp4_expert(e, blocks, scales);
      } else {
        w.gate_up_mxfp4_expert(e, blocks, scales);
      }
    };
  return f;
}

std::vector<ExpertParamMapping> fused_moe_stacked_mapping() {
  return {{"experts.w13_weight", "experts.gate_up_proj", -1, "gate_up"},
          {"experts.w2_weight", "experts.down_proj", -1, "down"}};
}

Tensor mxfp4_dequantize(const Tensor& blocks, const Tensor& scales, const std::string& what) {
  static constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  if (blocks.dtype() != DType::kU8 || blocks.dim() != 3 || blocks.size(2) != 16 ||
      (scales.dtype() != DType::kU8 && scales.dtype() != DType::kE8M0) || scales.dim() != 2 ||
      scales.size(0) != blocks.size(0) || scales.size(1) != blocks.size(1))
    fail("{}: MXFP4 blocks {} and scales {} do not match (blocks [rows, K/32, 16] U8, scales "
         "[rows, K/32] U8)",
         what, blocks.str(), scales.str());
  const int64_t rows = blocks.size(0), groups = blocks.size(1), K = groups * 32;
  const Tensor b = blocks.contiguous(), s = scales.contiguous();
  Tensor out = Tensor::empty({rows, K}, DType::kF32);
  const uint8_t* bp = static_cast<const uint8_t*>(b.data());
  const uint8_t* sp = static_cast<const uint8_t*>(s.data());
  float* op = out.ptr<float>();
  for (int64_t g = 0; g < rows * groups; ++g) {
    const float scale = std::ldexp(1.0f, static_cast<int>(sp[g]) - 127);
    for (int i = 0; i < 16; ++i) {
      const uint8_t byte = bp[g * 16 + i];
      op[g * 32 + 2 * i] = kE2m1[byte & 0x0F] * scale;
      op[g * 32 + 2 * i + 1] = kE2m1[byte >> 4] * scale;
    }
  }
  return out;
}

bool moe_fuse_shared_experts_from_env() { return env_bool("ATOM_MOE_FUSE_SHARED_EXPERTS", false); }

namespace {

// dst = src (converted), where dst's rows may be strided (a padded parameter's leading columns).
void assign_2d(Tensor& dst, const Tensor& src) {
  if (dst.is_contiguous()) return tensor_assign(dst, src);
  for (int64_t r = 0; r < dst.size(0); ++r) {
    Tensor d = dst.select(0, r);
    tensor_assign(d, src.select(0, r));
  }
}

void check_expert_tensor(const std::string& param, const Tensor& ckpt, const Shape& want,
                         const std::string& shard) {
  if (ckpt.shape() != want)
    fail("checkpoint tensor for '{}' (expert part {}) has shape {}, expected {}", param, shard,
         shape_str(ckpt.shape()), shape_str(want));
}

// The parts a parameter expects: each of this rank's routed experts (checkpoint ids), then the
// shared experts (as expert num_experts) when they are fused.
std::vector<std::string> expert_parts(const std::vector<int64_t>& local, int64_t num_experts,
                                      int64_t num_shared_slots,
                                      const std::vector<std::string>& shards) {
  std::vector<std::string> parts;
  auto add = [&](int64_t e) {
    for (const auto& s : shards) parts.push_back(Parameter::part_key(s, static_cast<int>(e)));
  };
  std::vector<int64_t> experts = local;  // each checkpoint expert once (replicas share a part)
  std::sort(experts.begin(), experts.end());
  experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
  for (const int64_t e : experts) add(e);
  if (num_shared_slots > 0) add(num_experts);
  return parts;
}

}  // namespace

std::vector<int64_t> eplb_placement(const std::vector<int64_t>& load, int64_t num_redundant,
                                    int ranks, const std::vector<int64_t>& current) {
  const int64_t E = static_cast<int64_t>(load.size()), P = E + num_redundant;
  ATOM_CHECK(E > 0 && ranks >= 1 && P % ranks == 0 && static_cast<int64_t>(current.size()) == P,
             "eplb_placement: {} experts + {} redundant over {} ranks, current placement of {}", E,
             num_redundant, ranks, current.size());
  const int64_t L = P / ranks;
  // 1. Copies: one each, then each redundant one to the expert with the most load per copy.
  std::vector<int64_t> copies(static_cast<size_t>(E), 1);
  for (int64_t i = 0; i < num_redundant; ++i) {
    int64_t best = 0;
    for (int64_t e = 1; e < E; ++e)  // load[e] / copies[e] > load[best] / copies[best]
      if (load[e] * copies[best] > load[best] * copies[e]) best = e;
    ++copies[best];
  }
  // 2. Copies by their share of the load, heaviest first, each to the least loaded rank with a
  // free slot, a rank without that expert yet if there is one.
  struct Item {
    double share;
    int64_t expert;
  };
  std::vector<Item> items;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t c = 0; c < copies[e]; ++c)
      items.push_back({static_cast<double>(load[e]) / static_cast<double>(copies[e]), e});
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.share > b.share; });
  std::vector<std::vector<int64_t>> held(static_cast<size_t>(ranks));
  std::vector<double> rank_load(static_cast<size_t>(ranks), 0.0);
  for (const Item& it : items) {
    int best = -1;
    bool best_fresh = false;
    for (int r = 0; r < ranks; ++r) {
      const auto& h = held[static_cast<size_t>(r)];
      if (static_cast<int64_t>(h.size()) == L) continue;
      const bool fresh = std::find(h.begin(), h.end(), it.expert) == h.end();
      if (best < 0 || (fresh && !best_fresh) ||
          (fresh == best_fresh && rank_load[r] < rank_load[static_cast<size_t>(best)])) {
        best = r;
        best_fresh = fresh;
      }
    }
    held[static_cast<size_t>(best)].push_back(it.expert);
    rank_load[static_cast<size_t>(best)] += it.share;
  }
  // 3. Slots: an expert already in one of the rank's slots stays there; the rest fill the others.
  std::vector<int64_t> next(static_cast<size_t>(P), -1);
  for (int r = 0; r < ranks; ++r) {
    std::vector<int64_t> want = held[static_cast<size_t>(r)];
    for (int64_t s = 0; s < L; ++s) {
      auto it = std::find(want.begin(), want.end(), current[r * L + s]);
      if (it == want.end()) continue;
      next[r * L + s] = *it;
      want.erase(it);
    }
    std::sort(want.begin(), want.end());
    size_t k = 0;
    for (int64_t s = 0; s < L; ++s)
      if (next[r * L + s] < 0) next[r * L + s] = want[k++];
  }
  return next;
}

double eplb_balancedness(const std::vector<int64_t>& load, int ranks,
                         const std::vector<int64_t>& placement) {
  const int64_t L = static_cast<int64_t>(placement.size()) / ranks;
  std::vector<int64_t> copies(load.size(), 0);
  for (const int64_t e : placement) ++copies[static_cast<size_t>(e)];
  std::vector<double> rank_load(static_cast<size_t>(ranks), 0.0);
  for (size_t p = 0; p < placement.size(); ++p) {
    const size_t e = static_cast<size_t>(placement[p]);
    rank_load[p / static_cast<size_t>(L)] +=
        static_cast<double>(load[e]) / static_cast<double>(copies[e]);
  }
  double sum = 0, mx = 0;
  for (const double v : rank_load) {
    sum += v;
    mx = std::max(mx, v);
  }
  return mx > 0 ? sum / ranks / mx : 1.0;
}

void FusedMoE::apply_placement() {
  const int64_t E = o_.num_experts, L = static_cast<int64_t>(placement_.size()) / ctx_.tp_size,
                width = replicas_.size(1);
  local_.assign(placement_.begin() + phys_first_, placement_.begin() + phys_first_ + L);
  Tensor table = Tensor::zeros({E, width}, DType::kI32), count = Tensor::zeros({E}, DType::kI32);
  for (size_t p = 0; p < placement_.size(); ++p) {
    const int64_t e = placement_[p];
    int32_t& c = count.ptr<int32_t>()[e];
    ATOM_CHECK(c < width, "EPLB placement: expert {} has more than {} copies", e, width);
    table.ptr<int32_t>()[e * width + c++] = static_cast<int32_t>(p);
  }
  for (int64_t e = 0; e < E; ++e)
    ATOM_CHECK(count.ptr<int32_t>()[e] >= 1, "EPLB placement: expert {} has no copy", e);
  replicas_.copy_from(table);
  replica_count_.copy_from(count);
}

bool FusedMoE::rebalance(Communicator& comm, std::pair<double, double>* balance) {
  ATOM_CHECK(replicas_.defined(), "{}: rebalance without redundant experts", w13_->name());
  const Tensor load_t = expert_load_.to(Device::cpu());
  const std::vector<int64_t> load(load_t.ptr<int64_t>(), load_t.ptr<int64_t>() + o_.num_experts);
  expert_load_.zero_();  // the next window
  const int ranks = ctx_.tp_size, me = ctx_.tp_rank;
  const int64_t P = static_cast<int64_t>(placement_.size()), L = P / ranks;
  const std::vector<int64_t> next = eplb_placement(load, P - o_.num_experts, ranks, placement_);
  if (balance)
    *balance = {eplb_balancedness(load, ranks, placement_), eplb_balancedness(load, ranks, next)};
  if (next == placement_) return false;
  // Every slot that changes takes its new expert's weights from the lowest physical copy of it in
  // the old placement: that rank contributes them to a sum over the ranks, the others zeros (a
  // broadcast through the one collective every communicator has; in F32, which holds BF16 and F16
  // exactly and every communicator sums), and the slot's rank keeps the result. All moves are
  // gathered before any slot is overwritten.
  std::vector<Parameter*> params;
  for (Parameter* p : {w13_, w2_, w13_bias_, w2_bias_, w13_scale_, w2_scale_})
    if (p) params.push_back(p);
  for (Parameter* p : params) {
    const DType dt = p->data().dtype();
    if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
      fail("{}: re-placing experts stored as {} is not supported (float experts only)", p->name(),
           dtype_name(dt));
  }
  struct Move {
    int64_t slot;  // destination, on this rank
    Parameter* param;
    Tensor data;
  };
  std::vector<Move> mine;
  for (int64_t q = 0; q < P; ++q) {
    if (next[q] == placement_[q]) continue;
    const int64_t src =
        std::find(placement_.begin(), placement_.end(), next[q]) - placement_.begin();
    for (Parameter* p : params) {
      const Tensor slot = p->data().select(0, src % L);
      const int64_t n = slot.numel();
      Tensor buf = Tensor::zeros({1, n}, DType::kF32, ctx_.device);
      if (src / L == me) kernels::cast(buf, slot.view({1, n}));
      comm.all_reduce_sum(buf);
      if (q / L == me) mine.push_back({q % L, p, buf});
    }
  }
  for (Move& m : mine) {
    Tensor dst = m.param->data().select(0, m.slot);
    Tensor flat = dst.view({1, dst.numel()});
    kernels::cast(flat, m.data);
  }
  placement_ = next;
  apply_placement();
  return true;
}

std::vector<int64_t> FusedMoE::slots_of(int64_t expert) const {
  std::vector<int64_t> r;
  for (size_t s = 0; s < local_.size(); ++s)
    if (local_[s] == expert) r.push_back(static_cast<int64_t>(s));
  return r;
}

bool FusedMoE::holds(int64_t expert) const {
  return std::find(local_.begin(), local_.end(), expert) != local_.end();
}

ExpertShare ExpertShare::of(int64_t num_experts, int rank, int ranks) {
  ATOM_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "expert share of rank {} of {}", rank, ranks);
  const int64_t base = num_experts / ranks, extra = num_experts % ranks;
  ExpertShare s;
  s.count = base + (rank < extra ? 1 : 0);
  s.first = rank * base + std::min<int64_t>(rank, extra);
  return s;
}

// The canonical stacked layout, written for every routed expert.
class FusedMoE::Writer : public FusedMoEWriter {
 public:
  explicit Writer(FusedMoE& m) : m_(m) {}

  int64_t num_experts() const override { return E(); }
  void gate_up(const Tensor& t) override {
    check(*m_.w13_, t, {E(), 2 * I(), m_.o_.hidden});
    for (int64_t e = 0; e < E(); ++e)
      if (held(e)) gate_up_expert(e, t.select(0, e));
  }
  void down(const Tensor& t) override {
    check(*m_.w2_, t, {E(), m_.o_.hidden, I()});
    for (int64_t e = 0; e < E(); ++e)
      if (held(e)) down_expert(e, t.select(0, e));
  }
  // Experts another rank holds (expert parallelism) are skipped here and in every call below:
  // a model's own format may convert expert by expert without asking.
  void gate_up_expert(int64_t e, const Tensor& t) override {
    ATOM_CHECK(e >= 0 && e < E(), "expert {} of '{}'", e, m_.w13_->name());
    check(*m_.w13_, t, {2 * I(), m_.o_.hidden});
    if (!held(e)) return;
    write(*m_.w13_, e, t.narrow(0, 0, I()), "w1");
    write(*m_.w13_, e, t.narrow(0, I(), I()), "w3");
  }
  void down_expert(int64_t e, const Tensor& t) override {
    ATOM_CHECK(e >= 0 && e < E(), "expert {} of '{}'", e, m_.w2_->name());
    check(*m_.w2_, t, {m_.o_.hidden, I()});
    if (!held(e)) return;
    write(*m_.w2_, e, t, "w2");
  }
  void gate_up_mxfp4_expert(int64_t e, const Tensor& blocks, const Tensor& scales) override {
    const int64_t H = m_.o_.hidden;
    check_mxfp4(*m_.w13_, blocks, scales, 2 * I(), H);
    ATOM_CHECK(e >= 0 && e < E(), "expert {} of '{}'", e, m_.w13_->name());
    if (!held(e)) return;
    if (!m_.packed_) return gate_up_expert(e, mxfp4_dequantize(blocks, scales, m_.w13_->name()));
    // This rank's gate rows, then its up rows, each half padded to Ip; scales k-group-major.
    const int64_t Ir = m_.inter_rank_, Ip = m_.inter_padded_, start = m_.inter_start(), G = H / 32,
                  rb = H / 2;
    const Tensor bc = blocks.contiguous(), sc = scales.contiguous();
    const uint8_t* bs = static_cast<const uint8_t*>(bc.data());
    const uint8_t* ss = static_cast<const uint8_t*>(sc.data());
    Tensor b = Tensor::zeros({2 * Ip, rb}, DType::kU8), s = Tensor::zeros({G, 2 * Ip}, DType::kU8);
    uint8_t* bd = static_cast<uint8_t*>(b.data());
    uint8_t* sd = static_cast<uint8_t*>(s.data());
    for (int64_t half = 0; half < 2; ++half)
      for (int64_t r = 0; r < Ir; ++r) {
        const int64_t src = half * I() + start + r, dst = half * Ip + r;
        std::memcpy(bd + dst * rb, bs + src * rb, rb);
        for (int64_t g = 0; g < G; ++g) sd[g * 2 * Ip + dst] = ss[src * G + g];
      }
    store(*m_.w13_, e, b, {"w1", "w3"});
    store(*m_.w13_scale_, e, s, {"s13"});
  }
  void down_mxfp4_expert(int64_t e, const Tensor& blocks, const Tensor& scales) override {
    const int64_t H = m_.o_.hidden;
    check_mxfp4(*m_.w2_, blocks, scales, H, I());
    ATOM_CHECK(e >= 0 && e < E(), "expert {} of '{}'", e, m_.w2_->name());
    if (!held(e)) return;
    if (!m_.packed_) return down_expert(e, mxfp4_dequantize(blocks, scales, m_.w2_->name()));
    // This rank's k range [start, start + Ir) of every output row (whole groups: Ir % 32 == 0).
    const int64_t Ir = m_.inter_rank_, Ip = m_.inter_padded_, start = m_.inter_start(),
                  G = I() / 32;
    const Tensor bc = blocks.contiguous(), sc = scales.contiguous();
    const uint8_t* bs = static_cast<const uint8_t*>(bc.data());
    const uint8_t* ss = static_cast<const uint8_t*>(sc.data());
    Tensor b = Tensor::zeros({H, Ip / 2}, DType::kU8), s = Tensor::zeros({Ip / 32, H}, DType::kU8);
    uint8_t* bd = static_cast<uint8_t*>(b.data());
    uint8_t* sd = static_cast<uint8_t*>(s.data());
    for (int64_t h = 0; h < H; ++h) {
      std::memcpy(bd + h * (Ip / 2), bs + h * (I() / 2) + start / 2, Ir / 2);
      for (int64_t g = 0; g < Ir / 32; ++g) sd[g * H + h] = ss[h * G + start / 32 + g];
    }
    store(*m_.w2_, e, b, {"w2"});
    store(*m_.w2_scale_, e, s, {"s2"});
  }
  void gate_up_bias(const Tensor& t) override {
    Parameter& p = bias(m_.w13_bias_, "gate/up bias");
    check(p, t, {E(), 2 * I()});
    const int64_t Ir = m_.inter_rank_, Ip = m_.inter_padded_, start = m_.inter_start();
    for (int64_t e = 0; e < E(); ++e) {
      if (!held(e)) continue;
      p.record_part(Parameter::part_key("b13", static_cast<int>(e)));
      for (const int64_t s : m_.slots_of(e))
        for (int half = 0; half < 2; ++half) {
          Tensor dst = p.data().select(0, s).narrow(0, half * Ip, Ir);
          tensor_assign(dst, t.select(0, e).narrow(0, half * I() + start, Ir));
        }
    }
  }
  void down_bias(const Tensor& t) override {
    Parameter& p = bias(m_.w2_bias_, "down bias");
    check(p, t, {E(), m_.o_.hidden});
    for (int64_t e = 0; e < E(); ++e) {
      if (!held(e)) continue;
      p.record_part(Parameter::part_key("b2", static_cast<int>(e)));
      // Summed over ranks after the combine: under tensor parallelism rank 0 adds it and the
      // others hold zeros; under expert parallelism the expert's one rank adds it.
      if (m_.expert_parallel() || m_.ctx_.tp_rank == 0)
        for (const int64_t s : m_.slots_of(e)) {
          Tensor dst = p.data().select(0, s);
          tensor_assign(dst, t.select(0, e));
        }
    }
  }

 private:
  int64_t E() const { return m_.o_.num_experts; }
  int64_t I() const { return m_.o_.intermediate; }
  bool held(int64_t e) const { return m_.holds(e); }
  Parameter& bias(Parameter* p, const char* what) {
    if (!p) fail("{}: this layer has no {} (FusedMoEOptions::bias)", m_.w13_->name(), what);
    return *p;
  }
  static void check(const Parameter& p, const Tensor& t, const Shape& want) {
    if (t.shape() != want)
      fail("stacked checkpoint tensor for '{}' has shape {}, expected {}", p.name(),
           shape_str(t.shape()), shape_str(want));
  }
  static void check_mxfp4(const Parameter& p, const Tensor& blocks, const Tensor& scales,
                          int64_t rows, int64_t k) {
    if (k % 32 != 0 || blocks.dtype() != DType::kU8 || blocks.shape() != Shape{rows, k / 32, 16} ||
        (scales.dtype() != DType::kU8 && scales.dtype() != DType::kE8M0) ||
        scales.shape() != Shape{rows, k / 32})
      fail("{}: MXFP4 blocks {} and scales {} do not match the layer (expected U8 [{}, {}, 16] "
           "and [{}, {}])",
           p.name(), blocks.str(), scales.str(), rows, k / 32, rows, k / 32);
  }
  // A packed slot written whole (a CPU tensor of the parameter's slot shape).
  void store(Parameter& p, int64_t e, const Tensor& t, std::vector<std::string> parts) {
    for (const auto& part : parts) p.record_part(Parameter::part_key(part, static_cast<int>(e)));
    for (const int64_t s : m_.slots_of(e)) {
      Tensor dst = p.data().select(0, s);
      tensor_assign(dst, t);
    }
  }
  void write(Parameter& p, int64_t e, const Tensor& t, const std::string& part) {
    p.record_part(Parameter::part_key(part, static_cast<int>(e)));
    for (const int64_t s : m_.slots_of(e)) {
      Tensor region = p.expert_layout->region(p.data().select(0, s), part);
      p.expert_layout->write(region, t, part);
    }
  }
  FusedMoE& m_;
};

FusedMoE::FusedMoE(LayerContext& ctx, const std::string& prefix, const FusedMoEOptions& o)
    : ctx_(ctx), o_(o) {
  const int tp = ctx.tp_size;
  if (o.num_experts <= 0 || o.hidden <= 0 || o.intermediate <= 0)
    fail("{}: a mixture of experts needs experts ({}), a hidden size ({}) and an intermediate "
         "size ({})",
         prefix, o.num_experts, o.hidden, o.intermediate);
  const bool ep = expert_parallel();
  if (!ep && o.intermediate % tp != 0)
    fail("{}: the experts' intermediate size {} is not divisible by the tensor-parallel size {}",
         prefix, o.intermediate, tp);
  if (ep && o.num_experts < tp)
    fail("{}: expert parallelism over {} ranks needs at least {} routed experts, the layer has {}",
         prefix, tp, tp, o.num_experts);
  ATOM_CHECK(!ep || o.num_shared_slots == 0,
             "{}: shared experts are not fused under expert parallelism", prefix);
  ATOM_CHECK(o.pad_intermediate_to >= 1, "{}: padding multiple {}", prefix, o.pad_intermediate_to);
  const ExpertShare share =
      ep ? ExpertShare::of(o.num_experts, ctx.tp_rank, tp) : ExpertShare{0, o.num_experts};
  const int64_t R = ep ? ctx.num_redundant_experts : 0;
  if (ctx.num_redundant_experts > 0 && !ep)
    fail("{}: redundant experts (EPLB) need expert parallelism over several ranks", prefix);
  if (R > 0) {
    // EPLB: E + R physical experts, (E + R) / ranks a rank; physical expert p starts as a copy of
    // logical expert p % E (vLLM's initial placement), rank r holding physical [r L, (r + 1) L).
    const int64_t P = o.num_experts + R;
    if (P % tp != 0)
      fail(
          "{}: {} experts plus {} redundant ones do not split evenly over {} expert-parallel ranks",
          prefix, o.num_experts, R, tp);
    const int64_t L = P / tp;
    phys_first_ = ctx.tp_rank * L;
    for (int64_t p = 0; p < P; ++p) placement_.push_back(p % o.num_experts);
    replicas_ = Tensor::zeros({o.num_experts, R + 1}, DType::kI32, ctx.device);
    replica_count_ = Tensor::zeros({o.num_experts}, DType::kI32, ctx.device);
    expert_load_ = Tensor::zeros({o.num_experts}, DType::kI64, ctx.device);
    apply_placement();
    if (ctx.eplb_layers) ctx.eplb_layers->push_back(this);
  } else {
    phys_first_ = share.first;
    for (int64_t e = share.first; e < share.first + share.count; ++e) local_.push_back(e);
  }
  slots_ = static_cast<int64_t>(local_.size()) + o.num_shared_slots;
  inter_rank_ = ep ? o.intermediate : o.intermediate / tp;
  inter_padded_ =
      (inter_rank_ + o.pad_intermediate_to - 1) / o.pad_intermediate_to * o.pad_intermediate_to;
  // MXFP4 stays packed where the fused kernels read it (CUDA, BF16 activations) and every rank
  // holds whole 32-value groups (gpt-oss: I = 2880 on 1, 2, 3 or 6 ranks, not 4); elsewhere the
  // experts are dequantised at load, as on the CPU.
  packed_ = o.quant == ExpertQuant::kMxfp4 && !ctx.device.is_cpu() &&
            ctx.act_dtype == DType::kBF16 && o.hidden % 32 == 0 && inter_rank_ % 32 == 0 &&
            o.num_shared_slots == 0;
  if (o.quant == ExpertQuant::kMxfp4 && !ctx.device.is_cpu() && !packed_)
    log_warn("{}: MXFP4 experts dequantised to {} at load (hidden size {}, {} intermediate "
             "channels on each of {} ranks: packed experts need whole 32-value groups)",
             prefix, dtype_name(ctx.weight_dtype), o.hidden, inter_rank_, tp);
  if (packed_) inter_padded_ = (inter_padded_ + 31) / 32 * 32;
  // FP8 experts (DeepSeek-V3's, Qwen3-FP8's 128x128 blocks, per-channel compressed-tensors): kept
  // FP8 with their scales where FP8 weights stay resident (LayerContext::fp8_resident: CUDA by
  // default, where the fused kernels expand each code with its block's scale just before the
  // MMAs, W8A16 with BF16 activations, the dequantised value to the bit; the CPU when asked,
  // computing the same fp32 weights as its reference) and this rank's slice cuts whole blocks;
  // elsewhere (the CPU reference, EPLB's copies, fused shared experts, ATOM_MOE_FP8_EXPERTS=0)
  // each expert is dequantised to the weight dtype at load.
  // (MXFP4 experts are not FP8, whatever the linears' method: DeepSeek-V4's FP4 experts beside
  // FP8 linears.)
  const LinearQuant quant =
      ctx.quant && o.quant != ExpertQuant::kMxfp4 ? ctx.quant->linear(prefix) : LinearQuant{};
  if (quant.fp8 && ctx.fp8_resident && (ctx.device.is_cpu() || ctx.act_dtype == DType::kBF16) &&
      env_bool("ATOM_MOE_FP8_EXPERTS", true)) {
    const bool block = quant.scales == Fp8Scales::kBlock,
               channel = quant.scales == Fp8Scales::kChannel;
    const int bn = block ? quant.block_n : 1, bk = block ? quant.block_k : 0;
    std::string why;
    if (!block && !channel)
      why = "per-tensor scales";
    else if (R > 0)
      why = "redundant experts (EPLB copies float experts only)";
    else if (o.num_shared_slots > 0)
      why = "fused shared experts";
    else if (o.hidden % 64 != 0 || bk % 64 != 0 || inter_rank_ % 64 != 0 ||
             (inter_rank_ != o.intermediate &&
              (inter_rank_ % bn != 0 || (bk > 0 && inter_rank_ % bk != 0))))
      why = fmt::format("hidden size {}, {} of {} intermediate channels a rank, blocks of {} x {}: "
                        "the kernels need multiples of 64, and a rank's slice whole blocks",
                        o.hidden, inter_rank_, o.intermediate, bn, bk);
    if (why.empty()) {
      fp8_bn_ = bn;
      fp8_bk_ = bk;
      inter_padded_ = (inter_padded_ + 127) / 128 * 128;
    } else {
      log_warn("{}: FP8 experts dequantised to {} at load ({})", prefix,
               dtype_name(ctx.weight_dtype), why);
    }
  }
  const int64_t E = o.num_experts, H = o.hidden, I = o.intermediate, Ir = inter_rank_,
                Ip = inter_padded_, S = o.num_shared_slots;
  const int64_t start = inter_start();
  const std::string w13_name = prefix_join(prefix, "w13_weight");
  const std::string w2_name = prefix_join(prefix, "w2_weight");

  auto w13_layout = std::make_shared<ExpertLayout>();
  w13_layout->num_base = share.count;
  w13_layout->first_base = share.first;
  w13_layout->stageable = R == 0;  // replicas: one checkpoint expert into several slots
  w13_layout->num_slots = slots_;
  w13_layout->shards = {"w1", "w3"};
  w13_layout->region = [Ip](const Tensor& slot, const std::string& shard) {
    return slot.narrow(0, shard == "w1" ? 0 : Ip, Ip);
  };
  w13_layout->write = [w13_name, I, H, Ir, start](Tensor& region, const Tensor& ckpt,
                                                  const std::string& shard) {
    check_expert_tensor(w13_name, ckpt, {I, H}, shard);
    Tensor dst = region.narrow(0, 0, Ir);
    tensor_assign(dst, ckpt.narrow(0, start, Ir));
  };
  auto w2_layout = std::make_shared<ExpertLayout>();
  w2_layout->num_base = share.count;
  w2_layout->first_base = share.first;
  w2_layout->stageable = R == 0;
  w2_layout->num_slots = slots_;
  w2_layout->shards = {"w2"};
  w2_layout->region = [](const Tensor& slot, const std::string&) { return slot; };
  w2_layout->write = [w2_name, I, H, Ir, start](Tensor& region, const Tensor& ckpt,
                                                const std::string& shard) {
    check_expert_tensor(w2_name, ckpt, {H, I}, shard);
    Tensor dst = region.narrow(1, 0, Ir);
    assign_2d(dst, ckpt.narrow(1, start, Ir));
  };

  // One loader for every parameter of the layer: per-expert tensors, the shared experts (cut into
  // their slots), stacked tensors of every routed expert, and the model's own stacked formats.
  auto write_part = [this, E, I, S](Parameter& p, const Tensor& ckpt, const std::string& shard,
                                    int expert) {
    Writer w(*this);
    if (auto it = o_.stacked_formats.find(shard); it != o_.stacked_formats.end())
      return it->second(w, ckpt, expert);
    if (expert == -1) {
      if (shard == "gate_up") return w.gate_up(ckpt);
      if (shard == "down") return w.down(ckpt);
      if (shard == "gate_up_bias") return w.gate_up_bias(ckpt);
      if (shard == "down_bias") return w.down_bias(ckpt);
    }
    ATOM_CHECK(p.expert_layout,
               "parameter '{}' takes stacked tensors only, not expert {} part '{}'", p.name(),
               expert, shard);
    const ExpertLayout& layout = *p.expert_layout;
    auto write_slot = [&](int64_t slot, const Tensor& t, const std::string& part) {
      Tensor region = layout.region(p.data().select(0, slot), part);
      layout.write(region, t, part);
    };
    if (expert >= 0 && expert < E) {
      // Another rank's expert never gets here (the loader leaves it unread: holds_expert).
      ATOM_CHECK(holds(expert), "'{}': expert {} is not on this rank", p.name(), expert);
      for (const int64_t s : slots_of(expert)) write_slot(s, ckpt, shard);
      return;
    }
    if (expert == E && S > 0) {  // the shared MLP, S * I wide
      const bool down = shard == "w2";
      const int64_t wide = ckpt.dim() == 2 ? ckpt.size(down ? 1 : 0) : -1;
      if (wide != S * I)
        fail("checkpoint tensor for '{}' (shared experts, part {}) has shape {}, expected "
             "{} intermediate channels",
             p.name(), shard, shape_str(ckpt.shape()), S * I);
      for (int64_t s = 0; s < S; ++s)
        write_slot(static_cast<int64_t>(local_.size()) + s, ckpt.narrow(down ? 1 : 0, s * I, I),
                   shard);
      return;
    }
    fail("parameter '{}' takes routed experts 0..{}{}, not expert {} part '{}'", p.name(), E - 1,
         S > 0 ? fmt::format(" and the shared experts as expert {}", E) : std::string(), expert,
         shard);
  };
  // FP8 experts (looked up by the experts' module): each expert part's weight waits for its
  // weight_scale (or the scale for its weight), then is written FP8 with its scales (fp8_bn_ > 0)
  // or dequantised to the weight dtype.
  struct Pending {
    std::mutex mu;
    std::map<std::string, std::pair<Tensor, Tensor>> parts;  // part key -> (weight, scale)
  };
  // An FP8 part of `weight` (is_scale: its scale) arrived; writes it once both are here.
  auto fp8_arrive = [this, write_part, quant](Parameter& weight, Pending& pending, const Tensor& t,
                                              const std::string& shard, int expert, bool is_scale) {
    const std::string what = fmt::format("{} (expert {} part {})", weight.name(), expert, shard);
    if (expert < 0)
      fail("{}: stacked FP8 expert tensors are not supported (FP8 checkpoints store experts one "
           "by one)",
           what);
    if (!is_scale && t.dtype() != DType::kF8E4M3)
      fail("{}: the quantization_config stores the experts as FP8, but the checkpoint weight is "
           "{}, not F8_E4M3",
           what, dtype_name(t.dtype()));
    const std::string key = Parameter::part_key(shard, expert);
    Tensor w, s;
    {
      std::lock_guard<std::mutex> lock(pending.mu);
      auto& [pw, ps] = pending.parts[key];
      (is_scale ? ps : pw) = t.clone();
      if (!pw.defined() || !ps.defined()) return;
      w = pw;
      s = ps;
      pending.parts.erase(key);
    }
    if (fp8_bn_ == 0) return write_part(weight, fp8_dequantize(w, s, quant, what), shard, expert);
    // The codes through the layout (this rank's rows of w1 / w3, its columns of w2), then the
    // scales of the same rows or columns.
    const bool down = shard == "w2";
    const int64_t N = down ? o_.hidden : o_.intermediate, K = down ? o_.intermediate : o_.hidden;
    fp8_check_weight(w, N, K, what);
    fp8_check_scale(s, N, K, quant, what);
    write_part(weight, w, shard, expert);
    const int64_t bn = fp8_bn_, bk = fp8_bk_, Ir = inter_rank_, start = inter_start();
    const Tensor sf = fp8_scale_to_f32(s, what).contiguous().view(
        {kernels::MoeExperts::fp8_blocks(N, bn), kernels::MoeExperts::fp8_blocks(K, bk)});
    Parameter& sp = &weight == w13_ ? *w13_scale_ : *w2_scale_;
    for (const int64_t slot : slots_of(expert)) {
      Tensor dst = sp.data().select(0, slot);
      // A slice starts on a block boundary; only a whole expert's may end in a partial block.
      if (!down) {
        const int64_t nr = kernels::MoeExperts::fp8_blocks(Ir, bn);
        Tensor rows = dst.narrow(0, shard == "w1" ? 0 : inter_padded_ / bn, nr);
        tensor_assign(rows, sf.narrow(0, start / bn, nr).contiguous());
      } else {
        const int64_t c0 = bk ? start / bk : 0, nc = kernels::MoeExperts::fp8_blocks(Ir, bk);
        Tensor cols = dst.narrow(1, 0, nc);
        assign_2d(cols, sf.narrow(1, c0, nc));
      }
    }
  };
  // Expert parallelism: the loader skips the tensors of experts another rank holds (the shared
  // experts, expert E, are never fused then).
  std::function<bool(int)> holds;
  if (ep) holds = [this](int e) { return this->holds(e); };
  auto add_weight = [&](const std::string& name, Shape shape, Shape scale_shape,
                        const std::shared_ptr<ExpertLayout>& layout,
                        Parameter** scale_param) -> Parameter* {
    const auto parts = expert_parts(local_, E, S, layout->shards);
    if (!quant.fp8) {
      Parameter* p = &ctx.params.add(name, ctx.param_tensor(std::move(shape), ctx.weight_dtype),
                                     write_part, parts);
      p->expert_layout = layout;
      p->holds_expert = holds;
      return p;
    }
    auto pending = std::make_shared<Pending>();
    const bool keep = fp8_bn_ > 0;
    Parameter* p = &ctx.params.add(
        name,
        ctx.param_tensor(std::move(shape), keep ? DType::kF8E4M3 : fp8_dequantized_dtype(ctx)),
        [fp8_arrive, pending](Parameter& w, const Tensor& t, const std::string& shard, int e) {
          fp8_arrive(w, *pending, t, shard, e, false);
        },
        parts);
    layout->stageable = false;  // FP8 parts go through the loader, which pairs them
    p->expert_layout = layout;
    p->holds_expert = holds;
    Parameter& sp = ctx.params.add(
        name + "_scale", ctx.param_tensor(keep ? std::move(scale_shape) : Shape{1}, DType::kF32),
        [fp8_arrive, pending, p](Parameter&, const Tensor& t, const std::string& shard, int e) {
          fp8_arrive(*p, *pending, t, shard, e, true);
        },
        parts);
    sp.holds_expert = holds;
    if (keep) *scale_param = &sp;  // --load-format dummy fills it as any FP8 weight's scale
    return p;
  };
  auto loader = write_part;
  if (packed_) {
    // Written whole per expert by the Writer (no per-expert regions for the staging pool).
    w13_ = &ctx.params.add(w13_name, ctx.param_tensor({slots_, 2 * Ip, H / 2}, DType::kU8), loader,
                           expert_parts(local_, E, 0, w13_layout->shards));
    w2_ = &ctx.params.add(w2_name, ctx.param_tensor({slots_, H, Ip / 2}, DType::kU8), loader,
                          expert_parts(local_, E, 0, w2_layout->shards));
    w13_scale_ = &ctx.params.add(prefix_join(prefix, "w13_weight_scale"),
                                 ctx.param_tensor({slots_, H / 32, 2 * Ip}, DType::kU8), loader,
                                 expert_parts(local_, E, 0, {"s13"}));
    w2_scale_ = &ctx.params.add(prefix_join(prefix, "w2_weight_scale"),
                                ctx.param_tensor({slots_, Ip / 32, H}, DType::kU8), loader,
                                expert_parts(local_, E, 0, {"s2"}));
    for (Parameter* p : {w13_, w2_, w13_scale_, w2_scale_}) p->holds_expert = holds;
    // --load-format dummy: random codes, and scales that keep the weights about 1/sqrt(fan in)
    // (e2m1 values are up to 6; an exponent of 127 - 8 gives |w| <= 6/256).
    w13_->dummy_fill = w2_->dummy_fill = [](Tensor& t, uint64_t seed) {
      kernels::fill_uniform_bytes(t, seed, 0, 255);
    };
    w13_scale_->dummy_fill = w2_scale_->dummy_fill = [](Tensor& t, uint64_t seed) {
      kernels::fill_uniform_bytes(t, seed, 118, 120);
    };
  } else {
    const int64_t bn = std::max(fp8_bn_, 1), bk = fp8_bk_;
    auto blocks = kernels::MoeExperts::fp8_blocks;
    w13_ = add_weight(w13_name, {slots_, 2 * Ip, H}, {slots_, 2 * Ip / bn, blocks(H, bk)},
                      w13_layout, &w13_scale_);
    w2_ = add_weight(w2_name, {slots_, H, Ip}, {slots_, blocks(H, bn), blocks(Ip, bk)}, w2_layout,
                     &w2_scale_);
  }
  if (o.bias) {
    ATOM_CHECK(S == 0, "{}: fused shared experts with expert biases", prefix);
    w13_bias_ = &ctx.params.add(prefix_join(prefix, "w13_bias"),
                                ctx.param_tensor({slots_, 2 * Ip}, ctx.weight_dtype), loader,
                                expert_parts(local_, E, 0, {"b13"}));
    w2_bias_ = &ctx.params.add(prefix_join(prefix, "w2_bias"),
                               ctx.param_tensor({slots_, H}, ctx.weight_dtype), loader,
                               expert_parts(local_, E, 0, {"b2"}));
    w13_bias_->holds_expert = w2_bias_->holds_expert = holds;
  }
}

void FusedMoE::forward(Step& step, const Tensor& x, const Tensor& topk_ids,
                       const Tensor& topk_weights, Tensor& out) {
  kernels::MoeExperts w;
  w.w13 = &w13_->data();
  w.w2 = &w2_->data();
  w.w13_bias = w13_bias_ ? &w13_bias_->data() : nullptr;
  w.w2_bias = w2_bias_ ? &w2_bias_->data() : nullptr;
  w.w13_scales = w13_scale_ ? &w13_scale_->data() : nullptr;
  w.w2_scales = w2_scale_ ? &w2_scale_->data() : nullptr;
  w.fp8_block_n = fp8_bn_;
  w.fp8_block_k = fp8_bk_;
  w.activation = o_.activation;
  const int64_t bytes = kernels::fused_moe_workspace_bytes(ctx_.device, x.size(0), topk_ids.size(1),
                                                           w, ctx_.act_dtype);
  Tensor workspace = bytes > 0 ? step.empty({bytes}, DType::kU8) : Tensor();
  kernels::fused_moe(out, x, w, topk_ids, topk_weights, bytes > 0 ? &workspace : nullptr);
}

void FusedMoE::bind_router(kernels::RouterArgs& a) {
  if (expert_parallel()) {  // this rank's range of (physical) experts
    a.local_first = static_cast<int>(phys_first_);
    a.local_count = static_cast<int>(num_local_experts());
  }
  if (replicas_.defined()) {  // EPLB
    a.replicas = &replicas_;
    a.replica_count = &replica_count_;
    a.expert_load = &expert_load_;
  }
}

namespace {
FusedMoEOptions experts_options(const SparseMoeOptions& o) {
  FusedMoEOptions f = o.experts;
  f.num_experts = o.num_experts;
  f.hidden = o.latent_hidden > 0 ? o.latent_hidden : o.hidden;
  f.intermediate = o.moe_intermediate;
  if (o.fuse_shared && o.shared_intermediate > 0) {
    if (o.shared_intermediate % o.moe_intermediate != 0)
      fail("shared experts of width {} cannot be fused as experts of width {}",
           o.shared_intermediate, o.moe_intermediate);
    f.num_shared_slots = o.shared_intermediate / o.moe_intermediate;
  }
  return f;
}
}  // namespace

SparseMoeBlock::SparseMoeBlock(LayerContext& ctx, const std::string& prefix,
                               const SparseMoeOptions& o)
    : ctx_(ctx),
      o_(o),
      args_(o.router),
      // The router stays in full precision (transformers and the FP8 checkpoints keep it so).
      gate_(ctx, prefix_join(prefix, o.gate_name), o.hidden, o.num_experts, o.router_bias,
            LinearStorage::kUnquantized),
      experts_(ctx, prefix_join(prefix, "experts"), experts_options(o)) {
  if (args_.top_k < 1 || args_.top_k > o.num_experts)
    fail("{}: num_experts_per_tok {} must be in [1, {}]", prefix, args_.top_k, o.num_experts);
  if (args_.n_group < 1 || o.num_experts % args_.n_group != 0 || args_.topk_group < 1 ||
      args_.topk_group > args_.n_group ||
      (args_.n_group > 1 && args_.topk_group * (o.num_experts / args_.n_group) < args_.top_k))
    fail("{}: {} experts in n_group {} keeping topk_group {} cannot give {} experts per token",
         prefix, o.num_experts, args_.n_group, args_.topk_group, args_.top_k);
  if (o.latent_hidden > 0) {
    if (o.fuse_shared && o.shared_intermediate > 0)
      fail("{}: shared experts cannot be fused into a latent MoE (they see the full hidden size)",
           prefix);
    latent_down_ = std::make_unique<ReplicatedLinear>(
        ctx, prefix_join(prefix, "routed_expert_down_proj"), o.hidden, o.latent_hidden, false);
    latent_up_ = std::make_unique<ReplicatedLinear>(
        ctx, prefix_join(prefix, "routed_expert_up_proj"), o.latent_hidden, o.hidden, false);
    if (o.latent_norm)
      latent_norm_ = std::make_unique<RMSNorm>(ctx, prefix_join(prefix, "routed_expert_norm"),
                                               o.latent_hidden, o.latent_norm_eps);
  } else if (o.latent_norm) {
    fail("{}: latent_norm without a latent MoE (latent_hidden 0)", prefix);
  }
  if (o.correction_bias)
    correction_ = &ctx.params.add(prefix_join(prefix, o.gate_name + ".e_score_correction_bias"),
                                  ctx.param_tensor({o.num_experts}, DType::kF32));
  const int64_t routed_slots = experts_.num_local_experts(),
                fused = experts_.num_slots() - routed_slots;
  args_.num_fused_shared = static_cast<int>(fused);
  args_.shared_slot_first = static_cast<int>(routed_slots);
  experts_.bind_router(args_);
  if (o.shared_intermediate > 0 && fused == 0)
    // Unfused shared experts apply the routed experts' activation too (clamped, SiTU).
    shared_ = std::make_unique<GatedMlp>(ctx, prefix_join(prefix, o.shared_name), o.hidden,
                                         o.shared_intermediate, false,
                                         /*reduce_results=*/false, o.experts.activation);
  if (o.shared_gate) {
    if (!shared_)
      fail("{}: a shared expert gate needs unfused shared experts (shared_intermediate > 0, "
           "fuse_shared off)",
           prefix);
    shared_gate_ =
        std::make_unique<ReplicatedLinear>(ctx, prefix_join(prefix, o.shared_gate_name), o.hidden,
                                           1, false, LinearStorage::kUnquantized);
  }
}

void SparseMoeBlock::route(Step& step, const Tensor& x, Tensor& topk_ids, Tensor& topk_weights) {
  const int64_t T = x.size(0), K = args_.top_k + args_.num_fused_shared;
  Tensor logits = step.empty({T, o_.num_experts}, DType::kF32);
  kernels::linear(logits, x, gate_.weight().data(), gate_.bias() ? gate_.bias()->data() : Tensor());
  topk_ids = step.empty({T, K}, DType::kI32);
  topk_weights = step.empty({T, K}, DType::kF32);
  kernels::moe_route(topk_ids, topk_weights, logits, correction_ ? correction_->data() : Tensor(),
                     args_);
}

Tensor SparseMoeBlock::forward(Step& step, const Tensor& x, const Tensor& out) {
  // shared_overlap: the shared experts first, on the side stream, joined before their sum.
  Tensor s;
#ifdef ATOM_HAVE_CUDA
  if (o_.shared_overlap && shared_ && !ctx_.device.is_cpu()) {
    if (!side_) side_ = std::make_shared<ForkedStream>(ctx_.device.index);
    side_->fork();
    CudaStreamGuard on_side(side_->get());
    s = shared_->forward(step, x);
  }
#endif
  Tensor ids, weights;
  route(step, x, ids, weights);
  const bool reduce = ctx_.tp_size > 1;
  Tensor y;
  if (latent_down_) {  // reduced before the norm: y is whole, the shared part reduced apart
    Tensor z = step.empty({x.size(0), o_.latent_hidden}, ctx_.act_dtype);
    experts_.forward(step, latent_down_->forward(step, x), ids, weights, z);
    if (reduce) ctx_.comm->all_reduce_sum(z);
    if (latent_norm_) z = latent_norm_->forward(step, z);
    y = latent_up_->forward(step, z, out);
  } else {
    y = out.defined() ? out : step.empty({x.size(0), o_.hidden}, ctx_.act_dtype);
    experts_.forward(step, x, ids, weights, y);
  }
  if (shared_) {
#ifdef ATOM_HAVE_CUDA
    if (s.defined()) side_->join();
#endif
    if (!s.defined()) s = shared_->forward(step, x);
    if (latent_down_ && reduce) ctx_.comm->all_reduce_sum(s);
    if (shared_gate_) {
      Tensor g = shared_gate_->forward(step, x);  // [T, 1], the same on every rank
      kernels::add_gated(y, y, s, g);
    } else {
      kernels::add(y, y, s);
    }
  }
  if (!latent_down_ && reduce) ctx_.comm->all_reduce_sum(y);  // one all-reduce of the partial sums
  return y;
}

}  // namespace atom
