// AtomTestRecurrentForCausalLM: a test-only hybrid architecture that exercises the per-request
// state slot pool the way gated delta net and KDA layers will. Layers are Llama decoder layers
// whose mixer is attention ("full_attention") or a recurrent layer ("recurrent" in layer_types):
//
//   u_t = in_proj(x_t);  s_t = a * s_{t-1} + (1 - a) * tanh(u_t);  y_t = out_proj(s_t)
//
// with one state s [hidden] per sequence in the slot batch.state_slots names, and a per-channel
// decay a in (0, 1). Wrong slots, a state carried across a preemption, or a chunk boundary that
// loses the state all change the logits, which is what the engine tests look for. CPU only; there
// is no checkpoint for it (load it with LoadFormat::kDummy). Linked into engine_state_test only, so
// the architecture never shows up in the atom program's registry.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "models/llama.h"

namespace atom {

namespace {

class TestRecurrentMixer {
 public:
  TestRecurrentMixer(LayerContext& ctx, const ModelConfig& c, const std::string& prefix)
      : in_proj_(ctx, prefix + ".in_proj", c.hidden_size, c.hidden_size, false),
        out_proj_(ctx, prefix + ".out_proj", c.hidden_size, c.hidden_size, false),
        hidden_(c.hidden_size) {
    ATOM_CHECK(ctx.state_specs, "{}: layer context collects no state specs", prefix);
    state_index_ = static_cast<int>(ctx.state_specs->size());
    ctx.state_specs->push_back({{hidden_}, DType::kF32});
    for (int64_t ch = 0; ch < hidden_; ++ch)  // spread decays over (0.5, 0.95)
      decay_.push_back(0.5f + 0.45f * static_cast<float>((ch * 7) % 11) / 11.0f);
  }

  // x [T, hidden] -> [T, hidden]
  Tensor forward(Step& step, const Tensor& x) {
    Tensor u = in_proj_.forward(step, x);
    ATOM_CHECK(u.device().is_cpu() && u.dtype() == DType::kF32 && u.is_contiguous(),
               "the test recurrent layer runs on the CPU in F32, got {}", u.str());
    ATOM_CHECK(step.kv && step.kv->state.size() > static_cast<size_t>(state_index_),
               "the test recurrent layer needs its state pool");
    Tensor& pool = step.kv->state[static_cast<size_t>(state_index_)];  // [slots, hidden]
    const Batch& b = step.batch;
    Tensor y = step.empty({u.size(0), hidden_}, DType::kF32);
    const float* up = u.ptr<float>();
    float* yp = y.ptr<float>();
    for (int s = 0; s < b.num_seqs(); ++s) {
      const int slot = b.state_slots.at(static_cast<size_t>(s));
      ATOM_CHECK(slot >= 0 && slot < pool.size(0), "sequence {} has state slot {} of {}", s, slot,
                 pool.size(0));
      float* st = pool.ptr<float>() + static_cast<int64_t>(slot) * hidden_;
      const int q0 = b.query_start[s], q1 = b.query_start[s + 1];
      // A sequence whose step starts at context index 0 is new (or recomputed): fresh state.
      if (b.context_lens[s] - (q1 - q0) == 0) std::memset(st, 0, sizeof(float) * hidden_);
      for (int t = q0; t < q1; ++t)
        for (int64_t ch = 0; ch < hidden_; ++ch) {
          const float a = decay_[static_cast<size_t>(ch)];
          st[ch] = a * st[ch] + (1.0f - a) * std::tanh(up[t * hidden_ + ch]);
          yp[t * hidden_ + ch] = st[ch];
        }
    }
    return out_proj_.forward(step, y);
  }

 private:
  ReplicatedLinear in_proj_, out_proj_;  // hidden -> hidden
  int64_t hidden_;
  int state_index_;
  std::vector<float> decay_;  // [hidden]
};

class TestHybridMixer {
 public:
  TestHybridMixer(LayerContext& ctx, const ModelConfig& c, int64_t layer,
                  const std::string& prefix) {
    if (!c.layer_types.empty() && c.layer_types.at(static_cast<size_t>(layer)) == "recurrent")
      recurrent_ = std::make_unique<TestRecurrentMixer>(ctx, c, prefix);
    else
      attention_ = std::make_unique<LlamaAttention>(ctx, c, layer, prefix);
  }
  Tensor forward(Step& step, const Tensor& x) {
    return recurrent_ ? recurrent_->forward(step, x) : attention_->forward(step, x);
  }

 private:
  std::unique_ptr<TestRecurrentMixer> recurrent_;
  std::unique_ptr<LlamaAttention> attention_;
};

}  // namespace

using AtomTestRecurrentForCausalLM = DecoderOnlyLM<LlamaDecoderLayer<TestHybridMixer>>;
static ModelSupport test_recurrent_support() {
  ModelSupport s;
  s.layer_types = {"full_attention", "recurrent"};
  return s;
}
ATOM_REGISTER_MODEL_SUPPORTING("AtomTestRecurrentForCausalLM", AtomTestRecurrentForCausalLM,
                               test_recurrent_support());

}  // namespace atom
