#include "engine/sequence_runner.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/tp_runner.h"
#include "kernels/sampling.h"

namespace atom {

namespace {

// One sequence whose context occupies pages 0, 1, 2, ... in order.
class SingleSequence {
 public:
  SingleSequence(Model& model, int capacity, int block_size, std::optional<DType> kv_cache_dtype)
      : runner_(std::make_unique<ModelRunner>(
            model, options(model, capacity, block_size, kv_cache_dtype))) {}
  SingleSequence(ModelGroup& models, int capacity, int block_size,
                 std::optional<DType> kv_cache_dtype) {
    RunnerOptions o = options(models.model(), capacity, block_size, kv_cache_dtype);
    o.num_state_slots = models.recurrent() ? 1 : 0;  // a stage's own layers may keep none
    runner_ = step_runner_create(models, o);
  }

  // Appends `tokens` to the context; returns logits of the listed rows (indices into `tokens`).
  Tensor step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& logit_rows,
              std::shared_ptr<const InputEmbeds> embeds = nullptr) {
    Batch b = append(tokens, logit_rows);
    b.input_embeds = std::move(embeds);
    return runner_->execute(b);
  }

  // Appends `tokens`; returns the argmax token of each listed row (computed on the device).
  std::vector<int32_t> step_greedy(const std::vector<int32_t>& tokens,
                                   const std::vector<int32_t>& logit_rows,
                                   std::shared_ptr<const InputEmbeds> embeds = nullptr) {
    Batch b = append(tokens, logit_rows);
    b.input_embeds = std::move(embeds);
    return runner_->execute_greedy(b);
  }

 private:
  // Pages for `capacity` tokens in order, one state slot for recurrent models.
  static RunnerOptions options(const Model& model, int capacity, int block_size,
                               std::optional<DType> kv_cache_dtype) {
    RunnerOptions o;
    o.num_pages = std::max(1, (capacity + block_size - 1) / block_size);
    o.block_size = block_size;
    o.num_state_slots = model.state_specs().empty() ? 0 : 1;
    o.max_model_len = o.num_pages * block_size;
    o.kv_cache_dtype = kv_cache_dtype;
    return o;
  }

  Batch append(const std::vector<int32_t>& tokens, const std::vector<int32_t>& logit_rows) {
    const int bs = runner_->block_size();
    const int q = static_cast<int>(tokens.size());
    Batch b;
    b.token_ids = tokens;
    for (int i = 0; i < q; ++i) {
      b.positions.push_back(len_ + i);
      b.slot_mapping.push_back(len_ + i);  // page p holds slots [p*bs, (p+1)*bs)
    }
    len_ += q;
    ATOM_CHECK(len_ <= runner_->num_pages() * bs, "sequence outgrew its {} pages",
               runner_->num_pages());
    b.query_start = {0, q};
    b.context_lens = {len_};
    const int pages = (len_ + bs - 1) / bs;
    b.page_indptr = {0, pages};
    for (int p = 0; p < pages; ++p) b.page_indices.push_back(p);
    b.logits_indices = logit_rows;
    b.state_slots = {0};
    return b;
  }

  std::unique_ptr<StepRunner> runner_;
  int len_ = 0;
};

// The runs of `e` (rows of a whole prompt) that fall in tokens [start, start + n).
std::shared_ptr<const InputEmbeds> embeds_for(const InputEmbeds* e, int64_t start, int64_t n) {
  return e ? input_embeds_window(*e, start, n) : nullptr;
}

// Model or ModelGroup: the sequence runs on one device or on every rank.
template <typename Models>
Tensor score_with(Models& models, const Model& model, const std::vector<int32_t>& tokens, int chunk,
                  int block_size, std::optional<DType> kv_cache_dtype,
                  const InputEmbeds* embeds = nullptr) {
  const int T = static_cast<int>(tokens.size());
  ATOM_CHECK(T > 0, "score needs at least one token");
  for (int32_t t : tokens)
    if (t < 0 || t >= model.vocab_size())
      fail("token id {} is outside the vocabulary [0, {})", t, model.vocab_size());
  if (embeds)
    for (const InputEmbeds::Run& r : embeds->runs)
      if (r.dst_row < 0 || r.values.dim() != 2 || r.dst_row + r.values.size(0) > T)
        fail("input embeddings {} at row {} fall outside the {} tokens", r.values.str(), r.dst_row,
             T);
  SingleSequence seq(models, T, block_size, kv_cache_dtype);
  Tensor out = Tensor::empty({T, model.vocab_size()}, DType::kF32);
  const int step = chunk > 0 ? chunk : T;
  for (int s = 0; s < T; s += step) {
    const int n = std::min(step, T - s);
    std::vector<int32_t> part(tokens.begin() + s, tokens.begin() + s + n), rows(n);
    for (int i = 0; i < n; ++i) rows[i] = i;
    Tensor logits = seq.step(part, rows, embeds_for(embeds, s, n));
    std::memcpy(out.ptr<float>() + static_cast<int64_t>(s) * model.vocab_size(), logits.data(),
                logits.nbytes());
  }
  return out;
}

template <typename Models>
GreedyResult greedy_with(Models& models, const Model& model, const std::vector<int32_t>& prompt,
                         int max_tokens, const std::vector<int64_t>& eos, bool ignore_eos,
                         int block_size, std::optional<DType> kv_cache_dtype,
                         const InputEmbeds* embeds = nullptr) {
  ATOM_CHECK(!prompt.empty(), "generate needs a non-empty prompt");
  for (int32_t t : prompt)
    if (t < 0 || t >= model.vocab_size())
      fail("prompt token id {} is outside the vocabulary [0, {})", t, model.vocab_size());
  GreedyResult r;
  r.finish_reason = "length";
  if (max_tokens <= 0) return r;
  SingleSequence seq(models, static_cast<int>(prompt.size()) + max_tokens, block_size,
                     kv_cache_dtype);
  int32_t next = seq.step_greedy(prompt, {static_cast<int32_t>(prompt.size()) - 1},
                                 embeds_for(embeds, 0, static_cast<int64_t>(prompt.size())))
                     .at(0);
  for (int i = 0; i < max_tokens; ++i) {
    r.token_ids.push_back(next);
    if (!ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) {
      r.finish_reason = "stop";
      break;
    }
    if (i + 1 < max_tokens) next = seq.step_greedy({next}, {0}).at(0);
  }
  return r;
}

}  // namespace

Tensor score_tokens(Model& model, const std::vector<int32_t>& tokens, int chunk, int block_size,
                    std::optional<DType> kv_cache_dtype, const InputEmbeds* embeds) {
  return score_with(model, model, tokens, chunk, block_size, kv_cache_dtype, embeds);
}

Tensor score_tokens(ModelGroup& models, const std::vector<int32_t>& tokens, int chunk,
                    int block_size, std::optional<DType> kv_cache_dtype) {
  return score_with(models, models.model(), tokens, chunk, block_size, kv_cache_dtype);
}

GreedyResult generate_greedy(Model& model, const std::vector<int32_t>& prompt, int max_tokens,
                             const std::vector<int64_t>& eos, bool ignore_eos, int block_size,
                             std::optional<DType> kv_cache_dtype, const InputEmbeds* embeds) {
  return greedy_with(model, model, prompt, max_tokens, eos, ignore_eos, block_size, kv_cache_dtype,
                     embeds);
}

GreedyResult generate_greedy(ModelGroup& models, const std::vector<int32_t>& prompt, int max_tokens,
                             const std::vector<int64_t>& eos, bool ignore_eos, int block_size,
                             std::optional<DType> kv_cache_dtype) {
  return greedy_with(models, models.model(), prompt, max_tokens, eos, ignore_eos, block_size,
                     kv_cache_dtype);
}

}  // namespace atom
