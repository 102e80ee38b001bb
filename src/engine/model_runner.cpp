#include "engine/model_runner.h"

#include <algorithm>

#include "core/log.h"
#include "engine/decode_graphs.h"
#include "kernels/elementwise.h"

#ifdef ATOM_HAVE_CUDA
#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#endif

namespace atom {

#ifdef ATOM_HAVE_CUDA
struct ModelRunner::Cuda {
  explicit Cuda(int device) : stream(device) {}
  CudaStream stream;
};
// Work of this runner goes to its own stream (CUDA graphs cannot capture the legacy stream).
#define ATOM_RUNNER_STREAM() \
  CudaStreamGuard atom_stream_guard_(cuda_ ? cuda_->stream.get() : cuda_current_stream())
#else
struct ModelRunner::Cuda {};
#define ATOM_RUNNER_STREAM() \
  do {                       \
  } while (0)
#endif

namespace {
// Tokens per sequence of the decode steps graphs are captured for: 1, and K + 1 for speculative
// verification (recurrent layers too: their graphs read the rollback slots uploaded with the
// batch, DecodeGraphs::pad).
[[maybe_unused]] std::vector<int> decode_query_lens(const Model&, const RunnerOptions& o) {
  std::vector<int> q = {1};
  if (o.num_speculative_tokens > 0) q.push_back(o.num_speculative_tokens + 1);
  return q;
}
}  // namespace

ModelRunner::ModelRunner(Model& model, int num_pages, int block_size, int num_state_slots)
    : model_(model), arena_(model.device(), 8 << 20) {
  RunnerOptions o;
  o.num_pages = std::max(1, num_pages);
  o.block_size = block_size;
  o.num_state_slots = num_state_slots;
  o.max_model_len = o.num_pages * block_size;
  init(o);
}

ModelRunner::ModelRunner(Model& model, const RunnerOptions& options)
    : model_(model), arena_(model.device(), 8 << 20) {
  init(options);
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::init(const RunnerOptions& o) {
  stage_in_ = o.stage_in;
  stage_out_ = o.stage_out;
  micro_batches_ = std::max(1, o.micro_batches);
  keep_hidden_ = o.num_speculative_tokens > 0;
  layer_outputs_ = o.layer_outputs;
  dp_size_ = model_.data_parallel_size();
  dp_rank_ = model_.data_parallel_rank();
  if (!layer_outputs_.empty() && !model_.hands_over_layer_outputs())
    fail("{} does not hand its layer outputs over (a block drafter, DSpark, drafts from them)",
         model_.config().architectures.at(0));
  const PipelineStage& st = model_.stage();
  ATOM_CHECK((st.first() || stage_in_) && (st.last() || stage_out_),
             "runner: pipeline stage {} of {} has no link to its neighbours", st.rank, st.size);
  ATOM_CHECK(o.block_size > 0 && o.max_num_seqs > 0, "runner: block_size {} max_num_seqs {}",
             o.block_size, o.max_num_seqs);
  max_model_len_ = o.max_model_len > 0 ? o.max_model_len
                                       : static_cast<int>(model_.config().max_position_embeddings);
  if (max_model_len_ <= 0) fail("runner: no max_model_len given and the model names none");
  const Device dev = model_.device();
  cache_specs_ = o.kv_cache_dtype ? cache_specs_with_dtype(model_.cache_specs(), *o.kv_cache_dtype)
                                  : model_.cache_specs();
  ATOM_CHECK(
      !o.kv_cache_dtype || dev.is_cpu() || *o.kv_cache_dtype == model_.act_dtype() ||
          *o.kv_cache_dtype == DType::kF8E4M3,
      "runner: the CUDA kernels read KV caches of the activation dtype {} or F8_E4M3, not {}",
      dtype_name(model_.act_dtype()), dtype_name(*o.kv_cache_dtype));
  // A recurrent layer's kernels write each sequence's state into its slot of the pool: a pool of
  // no slots would be written past its end (on CUDA, silently or as an illegal address).
  if (!model_.state_specs().empty() && o.num_state_slots <= 0)
    fail("runner: the model has recurrent layers, which need a state slot per sequence, but "
         "num_state_slots is {}",
         o.num_state_slots);
  int pages = o.num_pages;
#ifdef ATOM_HAVE_CUDA
  if (dev.is_cuda()) cuda_ = std::make_unique<Cuda>(dev.index);
#endif
  if (pages <= 0) {
    if (dev.is_cuda()) {
      pages = pages_from_memory(o);
    } else {
      // max_num_seqs full-length sequences, within 4 GiB of host memory (at least one sequence).
      const int64_t per_seq = (max_model_len_ + o.block_size - 1) / o.block_size;
      const size_t page_bytes =
          std::max<size_t>(1, KvCache::page_bytes(cache_specs_, o.block_size));
      const int64_t cap = static_cast<int64_t>((size_t{4} << 30) / page_bytes);
      pages = static_cast<int>(std::max(per_seq, std::min(per_seq * o.max_num_seqs, cap)));
    }
  }
  if (o.agree_pages) pages = o.agree_pages(pages);
  kv_ = KvCache::allocate(cache_specs_, pages, o.block_size, dev, model_.state_specs(),
                          o.num_state_slots);
#ifdef ATOM_HAVE_CUDA
  if (dev.is_cuda() && !o.enforce_eager && model_.runs_in_decode_graphs() && st.size == 1 &&
      dp_size_ == 1) {
    const int seqs = std::min(o.max_num_seqs, std::max(1, pages));
    graphs_ = std::make_unique<DecodeGraphs>(model_, kv_, max_model_len_, seqs,
                                             decode_query_lens(model_, o));
  }
#endif
}

// Sizes the KV cache like vLLM: profile the activations of the largest step, then give the KV
// cache what is left of gpu_memory_utilization x total memory.
int ModelRunner::pages_from_memory(const RunnerOptions& o) {
#ifdef ATOM_HAVE_CUDA
  const Device dev = model_.device();
  const auto& specs = cache_specs_;
  const int bs = o.block_size;
  const size_t page_bytes = KvCache::page_bytes(specs, bs);
  // No KV-cache layer (every layer recurrent): pages cost nothing, every sequence gets its whole
  // length (one page left a 2048-token prefill of a KDA-only model without pages).
  if (page_bytes == 0) return std::max(1, o.max_num_seqs) * ((max_model_len_ + bs - 1) / bs);
  // The largest step: max_num_batched_tokens tokens, as sequences of at most max_model_len.
  const int tokens = std::max(1, o.max_num_batched_tokens);
  {
    ATOM_RUNNER_STREAM();
    const int seq_len = std::min(tokens, max_model_len_);
    const int seqs = (tokens + seq_len - 1) / seq_len;
    const int pages_per = (seq_len + bs - 1) / bs;
    // With the recurrent layers' state for the profiled sequences (slots 0..seqs-1).
    KvCache scratch =
        KvCache::allocate(specs, seqs * pages_per, bs, dev, model_.state_specs(), seqs);
    Batch b;
    b.block_size = bs;
    b.query_start = {0};
    b.page_indptr = {0};
    for (int s = 0; s < seqs; ++s) {
      const int n = std::min(seq_len, tokens - s * seq_len);
      for (int i = 0; i < n; ++i) {
        b.token_ids.push_back(0);
        b.positions.push_back(i);
        b.slot_mapping.push_back(s * pages_per * bs + i);
      }
      b.query_start.push_back(b.query_start.back() + n);
      b.context_lens.push_back(n);
      for (int p = 0; p < (n + bs - 1) / bs; ++p) b.page_indices.push_back(s * pages_per + p);
      b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
      b.state_slots.push_back(s);
    }
    for (int i = std::max(0, tokens - o.max_num_seqs); i < tokens; ++i)
      b.logits_indices.push_back(i);
    arena_.reset();
    b.upload(arena_);
    Step step{b, arena_, &scratch};
    // Pipeline stages profile together, as a step runs: a later stage starts from what the one
    // before handed on, an earlier one hands its tensors on and computes no logits.
    IntermediateTensors in, out;
    if (stage_in_) {
      receive_stage_input(in, b.num_tokens());
      step.pp_in = &in;
    }
    if (stage_out_) step.pp_out = &out;
    Tensor h = model_.forward(step);
    if (stage_out_)
      send_stage_output(out);
    else
      model_.compute_logits(step, h);
    cuda_->stream.synchronize();
    arena_.reset();  // one block as large as the profiled step
  }
  cuda_cache_release(dev.index);
  const CudaMemoryInfo m = cuda_memory_info(dev.index);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double total = static_cast<double>(m.total_bytes);
  const double used = total - static_cast<double>(m.free_bytes);
  // Decode graphs get an arena of their own. Activations grow with the step's tokens, so a
  // decode step of max_num_seqs tokens needs about that share of the profiled step (plus its
  // logits rows, already in the profile), with a margin.
  const int q = decode_query_lens(model_, o).back();
  const double share = std::min(1.0, static_cast<double>(o.max_num_seqs) * q / tokens);
  const double graphs =
      o.enforce_eager || !model_.runs_in_decode_graphs()
          ? 0.0
          : 1.25 * share * static_cast<double>(arena_.capacity()) + 256.0 * 1024 * 1024;
  const double workspaces = 64.0 * 1024 * 1024;  // cuBLASLt per stream, kernel images
  // The recurrent state pool is allocated with the pages (KvCache::allocate).
  const double states = static_cast<double>(KvCache::state_slot_bytes(model_.state_specs())) *
                        std::max(0, o.num_state_slots);
  const double budget = total * o.gpu_memory_utilization - used - graphs - workspaces - states;
  const int need = (max_model_len_ + bs - 1) / bs;
  // Cache slots (page x block_size + offset) are 32-bit.
  const double max_pages = static_cast<double>(INT32_MAX / bs);
  const int pages =
      budget > 0 ? static_cast<int>(std::min(budget / static_cast<double>(page_bytes), max_pages))
                 : 0;
  if (pages < need)
    fail(
        "max_model_len {} needs {} KV-cache pages of {} tokens ({:.2f} GiB), but only {:.2f} GiB "
        "are "
        "left for the KV cache: {:.2f} GiB of GPU memory x gpu_memory_utilization {} = {:.2f} GiB, "
        "of which weights and other allocations use {:.2f} GiB, activations (profiled at {} "
        "tokens) "
        "{:.2f} GiB, decode graphs {:.2f} GiB, workspaces {:.2f} GiB and state slots {:.2f} GiB. "
        "Lower --max-model-len or raise --gpu-memory-utilization",
        max_model_len_, need, bs, need * static_cast<double>(page_bytes) / gib,
        std::max(budget, 0.0) / gib, total / gib, o.gpu_memory_utilization,
        total * o.gpu_memory_utilization / gib,
        (used - static_cast<double>(arena_.capacity())) / gib, tokens, arena_.capacity() / gib,
        graphs / gib, workspaces / gib, states / gib);
  log_info(
      "KV cache: {} pages of {} tokens ({:.2f} GiB, {} tokens) on {}; {:.2f} of {:.2f} GiB in use "
      "before it",
      pages, bs, pages * static_cast<double>(page_bytes) / gib, static_cast<int64_t>(pages) * bs,
      dev.str(), used / gib, total / gib);
  return pages;
#else
  fail("sizing the KV cache from GPU memory needs the CUDA backend");
#endif
}

std::vector<int> ModelRunner::graph_buckets() const {
  return graphs_ ? graphs_->buckets() : std::vector<int>{};
}

std::vector<int> ModelRunner::graph_query_lens() const {
  return graphs_ ? graphs_->query_lens() : std::vector<int>{};
}

int64_t ModelRunner::graph_steps() const { return graphs_ ? graphs_->replays() : 0; }

void ModelRunner::capture_decode_graphs() {
  if (!graphs_) return;
  ATOM_RUNNER_STREAM();
  graphs_->capture_all();
}

Tensor ModelRunner::forward_logits(Batch& batch) {
  batch.block_size = kv_.block_size;
  // Data-parallel attention: the step's pages are every rank's (this rank's share is cut out in
  // forward_part).
  batch.validate(static_cast<int64_t>(kv_.num_pages) * dp_size_,
                 kv_.state.empty() ? -1 : kv_.num_state_slots);
  arena_.reset();
  copy_state_slots(batch.state_copies);
  hidden_ = Tensor();
  layer_outputs_out_ = Tensor();
  if (graphs_ && graphs_->accepts(batch)) {
    const std::vector<Tensor>& out = graphs_->run(batch);
    hidden_ = out[1].narrow(0, 0, batch.num_tokens());
    return out[0].narrow(0, 0, static_cast<int64_t>(batch.logits_indices.size()));
  }
  const std::vector<int> cuts = micro_batch_cuts(batch, micro_batches_);
  if (cuts.size() <= 2) return forward_part(batch);
  // Pipeline micro-batches: the step's sequences in consecutive slices, each through this stage
  // and handed on before the next starts, so that the next stage works on one slice while this
  // one computes the following. Every rank cuts the same step the same way. The last stage
  // gathers the slices' logits rows in order (the batch's rows ascend: Batch::slice).
  const int64_t R = static_cast<int64_t>(batch.logits_indices.size());
  int64_t row = 0;
  Tensor l;
  const bool gather_hidden = keep_hidden_ && !stage_out_;
  bool hidden_whole = gather_hidden;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    Batch part = batch.slice(cuts[i], cuts[i + 1]);  // state copies: made above, once
    arena_.reset();  // the slices so far are done with it (their rows copied out)
    l = forward_part(part);
    if (gather_hidden && hidden_.defined() && hidden_.dim() == 2 &&
        hidden_.size(0) == part.num_tokens()) {
      const int64_t T = batch.num_tokens();
      if (!micro_hidden_.defined() || micro_hidden_.size(0) < T ||
          micro_hidden_.size(1) != hidden_.size(1) || micro_hidden_.dtype() != hidden_.dtype())
        micro_hidden_ = Tensor::empty({std::max<int64_t>(T, 1), hidden_.size(1)}, hidden_.dtype(),
                                      hidden_.device());
      Tensor dst = micro_hidden_.narrow(0, batch.query_start[static_cast<size_t>(cuts[i])],
                                        part.num_tokens());
      dst.copy_from(hidden_);
    } else {
      hidden_whole = false;
    }
    if (!l.defined() || l.size(0) == 0) continue;
    if (!micro_logits_.defined() || micro_logits_.size(0) < R || micro_logits_.size(1) != l.size(1))
      micro_logits_ = Tensor::empty({std::max<int64_t>(R, 1), l.size(1)}, l.dtype(), l.device());
    Tensor dst = micro_logits_.narrow(0, row, l.size(0));
    dst.copy_from(l);
    row += l.size(0);
  }
  // The step's hidden states in order when every slice gave its own (speculative decoding).
  hidden_ = hidden_whole ? micro_hidden_.narrow(0, 0, batch.num_tokens()) : Tensor();
  layer_outputs_out_ = Tensor();  // the last slice's alone: none kept over micro-batches
  if (stage_out_) return Tensor();
  ATOM_CHECK(row == R, "runner: micro-batches gave {} logits rows of the step's {}", row, R);
  return R == 0 ? l : micro_logits_.narrow(0, 0, R);  // no rows: the last slice's [0, vocab]
}

std::vector<int> micro_batch_cuts(const Batch& batch, int parts) {
  const int S = batch.num_seqs(), T = batch.num_tokens();
  parts = std::min(parts, S);
  if (parts <= 1 || !std::is_sorted(batch.logits_indices.begin(), batch.logits_indices.end()))
    return {0, S};
  // Boundaries at about equal token counts, each slice at least one sequence.
  std::vector<int> cuts{0};
  for (int k = 1; k < parts; ++k) {
    // The first sequence starting at or past k / parts of the tokens.
    int s = cuts.back() + 1;
    while (s < S - (parts - k) &&
           static_cast<int64_t>(batch.query_start[s]) * parts < static_cast<int64_t>(T) * k)
      ++s;
    cuts.push_back(s);
  }
  cuts.push_back(S);
  return cuts;
}

Tensor ModelRunner::forward_part(Batch& batch) {
  batch.upload(arena_);
  Step step{batch, arena_, &kv_};
  // Data-parallel attention: this rank's sequences as a step of their own on its cache; the
  // step itself addresses no cache.
  Step local{dp_local_, arena_, &kv_};
  DataParallelStep dp;
  if (dp_size_ > 1) {
    dp_local_ = batch.page_share(dp_rank_ * kv_.num_pages, kv_.num_pages, dp_rows_, dp_scatter_);
    dp_local_.validate(kv_.num_pages, kv_.state.empty() ? -1 : kv_.num_state_slots);
    dp_local_.upload(arena_);
    dp.local = &local;
    dp.local_tokens = static_cast<int64_t>(dp_rows_.size());
    dp.rows = upload(dp_rows_.data(), {dp.local_tokens}, DType::kI32);
    dp.scatter = upload(dp_scatter_.data(), {batch.num_tokens()}, DType::kI32);
    step.kv = nullptr;
    step.dp = &dp;
  }
  // Pipeline stages: the previous stage's tensors in, this stage's out (no logits before the
  // last stage).
  IntermediateTensors in, out;
  if (stage_in_) {
    receive_stage_input(in, batch.num_tokens());
    step.pp_in = &in;
  }
  if (stage_out_) step.pp_out = &out;
  // A block drafter's target layers (one micro-batch: a later slice would overwrite them).
  if (!layer_outputs_.empty()) {
    layer_outputs_out_ = Tensor();
    step.layer_outputs = &layer_outputs_;
    step.layer_outputs_out = &layer_outputs_out_;
  }
  hidden_ = model_.forward(step);
  if (stage_out_) {
    send_stage_output(out);
    return Tensor();
  }
  return model_.compute_logits(step, hidden_);
}

void ModelRunner::receive_stage_input(IntermediateTensors& in, int num_tokens) {
  std::vector<Tensor> got = stage_in_->recv();
  ATOM_CHECK(got.size() >= 2 && got[0].defined() && got[0].size(0) == num_tokens,
             "runner: stage {} received {} tensors for a step of {} tokens", model_.stage().rank,
             got.size(), num_tokens);
  // The link's host copies are this step's own: on the CPU they are used as they are, on a GPU
  // uploaded into the step's arena.
  if (!model_.device().is_cpu())
    for (Tensor& t : got)
      if (t.defined()) t = upload(t.data(), t.shape(), t.dtype());
  in.hidden = got[0];
  in.residual = got[1];
  in.extra.assign(got.begin() + 2, got.end());
}

void ModelRunner::send_stage_output(const IntermediateTensors& out) {
  std::vector<Tensor> send{out.hidden, out.residual};
  send.insert(send.end(), out.extra.begin(), out.extra.end());
#ifdef ATOM_HAVE_CUDA
  // The link copies the tensors to the host outside this runner's stream: they must be written.
  if (cuda_) cuda_->stream.synchronize();
#endif
  stage_out_->send(send);
}

void ModelRunner::copy_state_slots(const std::vector<std::pair<int32_t, int32_t>>& copies) {
  for (const auto& [from, to] : copies)
    for (Tensor& s : kv_.state) {
      ATOM_CHECK(from >= 0 && from < s.size(0) && to >= 0 && to < s.size(0),
                 "state slot copy {} -> {} of {} slots", from, to, s.size(0));
      Tensor dst = s.select(0, to);
      dst.copy_from(s.select(0, from));
    }
}

void ModelRunner::execute_forward(Batch& batch) {
  ATOM_RUNNER_STREAM();
  forward_logits(batch);
}

Tensor ModelRunner::execute(Batch& batch) {
  ATOM_RUNNER_STREAM();
  Tensor logits = forward_logits(batch);
  return logits.to(Device::cpu());
}

namespace {
std::vector<int32_t> ids_to_host(const Tensor& ids) {
  Tensor h = ids.to(Device::cpu());
  return std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + h.numel());
}
}  // namespace

std::vector<int32_t> ModelRunner::execute_greedy(Batch& batch) {
  ATOM_RUNNER_STREAM();
  Tensor logits = forward_logits(batch);
  Tensor ids = arena_.alloc({logits.size(0)}, DType::kI32);
  kernels::argmax(ids, logits);
  return ids_to_host(ids);
}

std::vector<int32_t> ModelRunner::execute_sample(Batch& batch,
                                                 const std::vector<kernels::SamplingRow>& rows) {
  ATOM_RUNNER_STREAM();
  Tensor logits = forward_logits(batch);
  ATOM_CHECK(static_cast<int64_t>(rows.size()) == logits.size(0),
             "execute_sample: {} rows for {} logits rows", rows.size(), logits.size(0));
  Tensor host = kernels::sampling_rows_tensor(rows);
  Tensor dev_rows = arena_.alloc(host.shape(), DType::kU8);
  dev_rows.copy_from(host);
  Tensor ids = arena_.alloc({logits.size(0)}, DType::kI32);
  kernels::sample(ids, logits, dev_rows);
  return ids_to_host(ids);
}

Tensor ModelRunner::upload(const void* data, Shape shape, DType dtype) {
  Tensor t = arena_.alloc(std::move(shape), dtype);
  memory_copy(t.data(), t.device(), data, Device::cpu(), t.nbytes());
  return t;
}

void ModelRunner::sample_rows(const Tensor& logits, const StepSampling& want,
                              std::vector<int32_t>& tokens) {
  const int64_t R = logits.size(0), V = logits.size(1);
  const int64_t n = static_cast<int64_t>(want.device_rows.size());
  // When most rows are drawn, every row is drawn (the others as an argmax, whose result is
  // dropped): cheaper than gathering the drawn rows into a copy of the logits.
  const bool every_row = 2 * n >= R;
  Tensor src = logits;
  if (every_row) {
    row_params_.assign(static_cast<size_t>(R), kernels::SamplingRow{});  // greedy
    for (int64_t i = 0; i < n; ++i) row_params_[want.device_rows[i]] = want.device_params[i];
  } else {
    Tensor index = upload(want.device_rows.data(), {n}, DType::kI32);
    src = arena_.alloc({n, V}, DType::kF32);
    kernels::gather_rows(src, logits, index);
    row_params_.assign(want.device_params.begin(), want.device_params.end());
  }
  const int64_t rows = src.size(0);
  if (!want.device_mask.empty()) {
    ATOM_CHECK(want.device_mask.size() == want.device_rows.size() && want.masks &&
                   want.mask_words * 64 >= V,
               "execute_sampling: {} mask indices for {} device rows, {} mask words for vocab {}",
               want.device_mask.size(), want.device_rows.size(), want.mask_words, V);
    // Waits for the host's masks here, after the forward was launched: they were computed while
    // it ran. Only the bit sets cross to the device ([rows, V / 64] words, not the logits).
    const std::span<const uint64_t> table = want.masks();
    const int64_t M = static_cast<int64_t>(table.size()) / want.mask_words;
    ATOM_CHECK(M * want.mask_words == static_cast<int64_t>(table.size()),
               "execute_sampling: mask table of {} words is not [rows, {}]", table.size(),
               want.mask_words);
    mask_index_.assign(static_cast<size_t>(rows), -1);
    for (int64_t i = 0; i < n; ++i)
      mask_index_[static_cast<size_t>(every_row ? want.device_rows[i] : i)] = want.device_mask[i];
    Tensor masks = upload(table.data(), {M, want.mask_words}, DType::kU64);
    Tensor index = upload(mask_index_.data(), {rows}, DType::kI32);
    // In place: when src is the logits themselves, only device rows are masked, and the host
    // rows copied after this are other rows.
    kernels::mask_logits(src, masks, index);
  }
  Tensor params = upload(row_params_.data(),
                         {rows, static_cast<int64_t>(sizeof(kernels::SamplingRow))}, DType::kU8);
  Tensor ids = arena_.alloc({rows}, DType::kI32);
  kernels::sample(ids, src, params);
  ids_host_.resize(static_cast<size_t>(rows));
  memory_copy(ids_host_.data(), Device::cpu(), ids.data(), ids.device(), ids.nbytes());
  tokens.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    tokens[i] = ids_host_[static_cast<size_t>(every_row ? want.device_rows[i] : i)];
}

Tensor ModelRunner::host_rows(const Tensor& logits, const std::vector<int32_t>& rows) {
  const int64_t R = logits.size(0), V = logits.size(1);
  const int64_t n = static_cast<int64_t>(rows.size());
  bool identity = n == R;
  for (int64_t i = 0; identity && i < n; ++i) identity = rows[i] == i;
  if (identity && logits.device().is_cpu() && logits.is_contiguous()) return logits;
  if (!host_logits_.defined() || host_logits_.size(0) < n || host_logits_.size(1) != V) {
    const int64_t grown = host_logits_.defined() && host_logits_.size(1) == V
                              ? host_logits_.size(0) + host_logits_.size(0) / 2
                              : 0;
    host_logits_ = Tensor::empty({std::max(n, grown), V}, DType::kF32);
  }
  Tensor out = host_logits_.narrow(0, 0, n);
  if (identity) {
    out.copy_from(logits);
    return out;
  }
  Tensor index = upload(rows.data(), {n}, DType::kI32);
  if (logits.device().is_cpu()) {
    kernels::gather_rows(out, logits, index);
  } else {
    Tensor gathered = arena_.alloc({n, V}, DType::kF32);
    kernels::gather_rows(gathered, logits, index);
    out.copy_from(gathered);
  }
  return out;
}

void ModelRunner::execute_sampling(Batch& batch, const StepSampling& want, StepSamples& out) {
  ATOM_RUNNER_STREAM();
  ATOM_CHECK(want.device_params.size() == want.device_rows.size(),
             "execute_sampling: {} device rows with {} parameter sets", want.device_rows.size(),
             want.device_params.size());
  Tensor logits = forward_logits(batch);
  const int64_t R = logits.size(0);
  for (const auto* rows : {&want.device_rows, &want.host_rows})
    for (int32_t r : *rows)
      ATOM_CHECK(r >= 0 && r < R, "execute_sampling: logits row {} of {}", r, R);
  out.tokens.clear();
  if (!want.device_rows.empty()) sample_rows(logits, want, out.tokens);
  out.host_logits = want.host_rows.empty() ? Tensor() : host_rows(logits, want.host_rows);
}

}  // namespace atom
