#include "engine/spec_decode.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "engine/decode_graphs.h"
#include "kernels/elementwise.h"
#include "kernels/sampling.h"

#ifdef ATOM_HAVE_CUDA
#include "core/cuda_stream.h"
#endif

namespace atom {

#ifdef ATOM_HAVE_CUDA
struct MtpProposer::Cuda {
  explicit Cuda(int device) : stream(device) {}
  CudaStream stream;
};
// The drafter's work goes to its own stream (CUDA graphs cannot capture the legacy stream). The
// target's step it reads has been waited for (its tokens came back to the host), and the drafts
// come back before the target's next step is queued.
#define ATOM_DRAFT_STREAM() \
  CudaStreamGuard atom_stream_guard_(cuda_ ? cuda_->stream.get() : cuda_current_stream())
#else
struct MtpProposer::Cuda {};
#define ATOM_DRAFT_STREAM() \
  do {                      \
  } while (0)
#endif

namespace {
void batch_clear(Batch& b, int block_size) {
#define ATOM_SPEC_CLEAR(name, extent) b.name.clear();
  ATOM_BATCH_FIELDS(ATOM_SPEC_CLEAR)
#undef ATOM_SPEC_CLEAR
  b.state_copies.clear();
  b.block_size = block_size;
  b.query_start.push_back(0);
  b.page_indptr.push_back(0);
  b.max_query_len = 0;
  b.max_context_len = 0;
}

// One sequence's rows at positions [pos, pos + tokens.size()).
void batch_add(Batch& b, const Sequence& seq, int pos, std::span<const int32_t> tokens,
               bool logits) {
  const int bs = b.block_size, n = static_cast<int>(tokens.size()), end = pos + n;
  ATOM_CHECK(static_cast<int64_t>(seq.block_table.size()) * bs >= end,
             "drafter: positions up to {} with {} blocks", end, seq.block_table.size());
  for (int i = 0; i < n; ++i) {
    b.token_ids.push_back(tokens[static_cast<size_t>(i)]);
    b.positions.push_back(pos + i);
    b.slot_mapping.push_back(seq.block_table[static_cast<size_t>((pos + i) / bs)] * bs +
                             (pos + i) % bs);
  }
  b.query_start.push_back(b.num_tokens());
  b.context_lens.push_back(end);
  const int pages = (end + bs - 1) / bs;
  b.page_indices.insert(b.page_indices.end(), seq.block_table.begin(),
                        seq.block_table.begin() + pages);
  b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
  if (logits) b.logits_indices.push_back(b.num_tokens() - 1);
  b.max_query_len = std::max(b.max_query_len, n);
  b.max_context_len = std::max(b.max_context_len, end);
}

Tensor upload_i32(Arena& arena, const std::vector<int32_t>& v) {
  Tensor t = arena.alloc({static_cast<int64_t>(v.size())}, DType::kI32);
  memory_copy(t.data(), t.device(), v.data(), Device::cpu(), t.nbytes());
  return t;
}
// With graphs: one sequence's accepted rows at [pos, pos + tokens.size()) padded to q rows. The
// padding rows (token 0, after the logits row, so no real row attends to them) write no cache
// slot; their context's pages beyond the block table repeat its last page (read, never written).
void batch_add_padded(Batch& b, const Sequence& seq, int pos, std::span<const int32_t> tokens,
                      int q) {
  const int bs = b.block_size, n = static_cast<int>(tokens.size()), end = pos + q;
  ATOM_CHECK(n >= 1 && n <= q && static_cast<int64_t>(seq.block_table.size()) * bs >= pos + n,
             "drafter: {} rows at {} padded to {} with {} blocks", n, pos, q,
             seq.block_table.size());
  const int row0 = b.num_tokens();
  for (int i = 0; i < q; ++i) {
    b.token_ids.push_back(i < n ? tokens[static_cast<size_t>(i)] : 0);
    b.positions.push_back(pos + i);
    b.slot_mapping.push_back(
        i < n ? seq.block_table[static_cast<size_t>((pos + i) / bs)] * bs + (pos + i) % bs : -1);
  }
  b.query_start.push_back(b.num_tokens());
  b.context_lens.push_back(end);
  const int pages = (end + bs - 1) / bs;
  for (int p = 0; p < pages; ++p)
    b.page_indices.push_back(
        seq.block_table[std::min(static_cast<size_t>(p), seq.block_table.size() - 1)]);
  b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
  b.logits_indices.push_back(row0 + n - 1);
  b.max_query_len = std::max(b.max_query_len, q);
  b.max_context_len = std::max(b.max_context_len, end);
}

void copy_rows(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t rows) {
  ATOM_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.dtype() == src.dtype(),
             "drafter: copy of {} rows of {} into {}", rows, src.str(), dst.str());
  const size_t row = dst.nbytes() / static_cast<size_t>(std::max<int64_t>(1, dst.size(0)));
  memory_copy(static_cast<char*>(dst.data()) + dst_offset * static_cast<int64_t>(row), dst.device(),
              src.data(), src.device(), static_cast<size_t>(rows) * row);
}
}  // namespace

MtpProposer::MtpProposer(DraftModel& drafter, int num_pages, int block_size, DType kv_dtype,
                         const MtpProposerOptions& options)
    : drafter_(drafter), options_(options), arena_(drafter.device(), 8 << 20) {
  kv_ = KvCache::allocate(cache_specs_with_dtype(drafter.cache_specs(), kv_dtype), num_pages,
                          block_size, drafter.device());
  const Device dev = drafter.device();
#ifdef ATOM_HAVE_CUDA
  if (dev.is_cuda()) cuda_ = std::make_unique<Cuda>(dev.index);
#endif
  options_.graphs = options.graphs && dev.is_cuda();
  if (!options_.graphs) return;
  const int K = options.num_speculative_tokens;
  ATOM_CHECK(K >= 1 && K <= 4 && options.max_model_len > 0 && options.max_num_seqs > 0,
             "drafter graphs: K {} max_model_len {} max_num_seqs {}", K, options.max_model_len,
             options.max_num_seqs);
  ATOM_DRAFT_STREAM();
  const int seqs = std::min(options.max_num_seqs, std::max(1, num_pages));
  options_.max_num_seqs = seqs;
  input_ = Tensor::zeros({static_cast<int64_t>(seqs) * (K + 1), drafter.config().hidden_size},
                         drafter.act_dtype(), dev);
  draft_ids_ = Tensor::zeros({static_cast<int64_t>(K) * seqs}, DType::kI32, dev);
  // Step 0 runs layer 0 over K + 1 rows per sequence; step k >= 1 layer k % layers over one.
  const int layers = drafter.num_draft_layers();
  graphs_.resize(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    std::vector<int> q;
    if (l == 0) q.push_back(K + 1);
    for (int k = 1; k < K; ++k)
      if (k % layers == l) q.push_back(1);
    if (q.empty()) continue;
    graphs_[static_cast<size_t>(l)] = std::make_unique<DecodeGraphs>(
        dev, kv_, options.max_model_len, seqs, q, GraphLogitsRows::kOnePerSeq,
        [this, l](Step& step) { return forward_step(step, l); });
    graphs_[static_cast<size_t>(l)]->capture_all();
  }
}

MtpProposer::~MtpProposer() = default;

int MtpProposer::num_graphs() const {
  int n = 0;
  for (const auto& g : graphs_)
    if (g) n += g->num_graphs();
  return n;
}

int64_t MtpProposer::graph_steps() const {
  int64_t n = 0;
  for (const auto& g : graphs_)
    if (g) n += g->replays();
  return n;
}

DecodeGraphs& MtpProposer::graphs_for(int k) {
  auto& g = graphs_.at(static_cast<size_t>(k % static_cast<int>(graphs_.size())));
  ATOM_CHECK(g != nullptr, "drafter: no graphs for draft step {}", k);
  return *g;
}

std::vector<Tensor> MtpProposer::forward_step(Step& step, int k) {
  Tensor in = input_.narrow(0, 0, step.batch.num_tokens());
  Tensor y = drafter_.forward_draft(step, in, k);
  Tensor logits = drafter_.compute_draft_logits(step, y, k);
  Tensor ids = step.empty({logits.size(0)}, DType::kI32);
  kernels::argmax(ids, logits);
  Tensor rows = step.empty({logits.size(0), y.size(1)}, y.dtype());
  kernels::gather_rows(rows, y, step.batch.dev.logits_indices);
  return {ids, rows};
}

bool MtpProposer::propose_graphs(const Tensor& target_hidden, std::span<const DraftRequest> reqs,
                                 int block_size, std::vector<std::vector<int32_t>>& drafts) {
  const int K = options_.num_speculative_tokens, q0 = K + 1;
  // Steady decoding: every sequence's accepted run fits K + 1 rows and all want W drafts.
  int W = -1, S = 0;
  for (const DraftRequest& r : reqs) {
    if (r.num_rows <= 0) continue;
    if (r.num_rows > q0 || (W >= 0 && r.num_drafts != W) ||
        r.first_pos + q0 > options_.max_model_len)
      return false;
    W = r.num_drafts;
    ++S;
  }
  if (S == 0 || W < 1 || W > K || S > options_.max_num_seqs || !target_hidden.defined())
    return false;
  batch_clear(batch_, block_size);
  index_host_.clear();
  std::vector<int> last;  // each sequence's last accepted position, in row order
  std::vector<size_t> which;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const DraftRequest& r = reqs[i];
    if (r.num_rows <= 0) continue;
    const Sequence& seq = *r.seq;
    ATOM_CHECK(r.first_pos + r.num_rows < seq.num_tokens(),
               "drafter: rows up to {} need the token after them ({} tokens)",
               r.first_pos + r.num_rows - 1, seq.num_tokens());
    batch_add_padded(batch_, seq, r.first_pos,
                     std::span<const int32_t>(seq.tokens.data() + r.first_pos + 1,
                                              static_cast<size_t>(r.num_rows)),
                     q0);
    for (int j = 0; j < q0; ++j) index_host_.push_back(r.first_row + std::min(j, r.num_rows - 1));
    last.push_back(r.first_pos + r.num_rows - 1);
    which.push_back(i);
  }
  DecodeGraphs& g0 = graphs_for(0);
  if (!g0.accepts(batch_)) return false;
  batch_.validate(kv_.num_pages);
  arena_.reset();
  Tensor index = upload_i32(arena_, index_host_);
  Tensor in = input_.narrow(0, 0, index.numel());
  kernels::gather_rows(in, target_hidden, index);
  {
    const std::vector<Tensor>& out = g0.run(batch_);
    copy_rows(draft_ids_, 0, out[0], S);
    copy_rows(input_, 0, out[1], S);
  }
  // Steps 1..W-1: one row per sequence at last + k; its token is the previous step's argmax,
  // copied on the device over the uploaded placeholder.
  const int32_t placeholder = 0;
  for (int k = 1; k < W; ++k) {
    batch_clear(batch_, block_size);
    for (size_t w = 0; w < which.size(); ++w)
      batch_add(batch_, *reqs[which[w]].seq, last[w] + k, std::span<const int32_t>(&placeholder, 1),
                true);
    DecodeGraphs& g = graphs_for(k);
    ATOM_CHECK(g.accepts(batch_), "drafter: draft step {} of {} sequences fits no graph", k, S);
    const std::vector<Tensor>& out = g.run(batch_, [&](Batch& p) {
      Tensor prev = draft_ids_.narrow(0, static_cast<int64_t>(k - 1) * S, S);
      copy_rows(p.dev.token_ids, 0, prev, S);
    });
    copy_rows(draft_ids_, static_cast<int64_t>(k) * S, out[0], S);
    copy_rows(input_, 0, out[1], S);
  }
  ids_host_.resize(static_cast<size_t>(W) * S);
  memory_copy(ids_host_.data(), Device::cpu(), draft_ids_.data(), draft_ids_.device(),
              ids_host_.size() * sizeof(int32_t));
  for (size_t w = 0; w < which.size(); ++w)
    for (int k = 0; k < W; ++k)
      drafts[which[w]].push_back(ids_host_[static_cast<size_t>(k) * S + w]);
  return true;
}

std::vector<int32_t> MtpProposer::run(Batch& b, const Tensor& hidden, int k) {
  b.validate(kv_.num_pages);
  b.upload(arena_);
  Step step{b, arena_, &kv_};
  Tensor y = drafter_.forward_draft(step, hidden, k);
  Tensor logits = drafter_.compute_draft_logits(step, y, k);
  Tensor ids = arena_.alloc({logits.size(0)}, DType::kI32);
  kernels::argmax(ids, logits);
  Tensor rows = arena_.alloc({logits.size(0), y.size(1)}, y.dtype());
  kernels::gather_rows(rows, y, b.dev.logits_indices);
  carry_ = rows.clone();
  Tensor host = ids.to(Device::cpu());
  return std::vector<int32_t>(host.ptr<int32_t>(), host.ptr<int32_t>() + host.numel());
}

void MtpProposer::propose(const Tensor& target_hidden, std::span<const DraftRequest> reqs,
                          int block_size, std::vector<std::vector<int32_t>>& drafts) {
  ATOM_DRAFT_STREAM();
  drafts.assign(reqs.size(), {});
  if (options_.graphs && propose_graphs(target_hidden, reqs, block_size, drafts)) return;
  // Step 0: every accepted row, (token after it, the target's hidden state of it).
  batch_clear(batch_, block_size);
  std::vector<int32_t> hidden_rows, wanting;  // wanting: reqs with a logits row, in row order
  for (size_t i = 0; i < reqs.size(); ++i) {
    const DraftRequest& r = reqs[i];
    if (r.num_rows <= 0) continue;
    const Sequence& seq = *r.seq;
    ATOM_CHECK(r.first_pos + r.num_rows < seq.num_tokens(),
               "drafter: rows up to {} need the token after them ({} tokens)",
               r.first_pos + r.num_rows - 1, seq.num_tokens());
    batch_add(batch_, seq, r.first_pos,
              std::span<const int32_t>(seq.tokens.data() + r.first_pos + 1,
                                       static_cast<size_t>(r.num_rows)),
              r.num_drafts > 0);
    for (int j = 0; j < r.num_rows; ++j) hidden_rows.push_back(r.first_row + j);
    if (r.num_drafts > 0) wanting.push_back(static_cast<int32_t>(i));
  }
  if (batch_.num_tokens() == 0) return;
  ATOM_CHECK(target_hidden.defined(),
             "speculative decoding: the target's runner kept no hidden states for the drafter");
  arena_.reset();
  Tensor index = upload_i32(arena_, hidden_rows);
  Tensor hidden = arena_.alloc({index.numel(), target_hidden.size(1)}, target_hidden.dtype());
  kernels::gather_rows(hidden, target_hidden, index);
  std::vector<int32_t> ids = run(batch_, hidden, 0);
  for (size_t w = 0; w < wanting.size(); ++w)
    drafts[static_cast<size_t>(wanting[w])].push_back(ids[w]);
  // Steps 1..: one row per sequence still wanting drafts, on the drafter's own output.
  for (int k = 1; !wanting.empty(); ++k) {
    std::vector<int32_t> still, carry_rows;
    for (size_t w = 0; w < wanting.size(); ++w)
      if (reqs[static_cast<size_t>(wanting[w])].num_drafts > k) {
        still.push_back(wanting[w]);
        carry_rows.push_back(static_cast<int32_t>(w));
      }
    if (still.empty()) break;
    batch_clear(batch_, block_size);
    for (int32_t i : still) {
      const DraftRequest& r = reqs[static_cast<size_t>(i)];
      const int32_t last = drafts[static_cast<size_t>(i)].back();
      batch_add(batch_, *r.seq, r.first_pos + r.num_rows - 1 + k,
                std::span<const int32_t>(&last, 1), true);
    }
    Tensor prev = carry_;
    arena_.reset();
    Tensor h = arena_.alloc({static_cast<int64_t>(still.size()), prev.size(1)}, prev.dtype());
    kernels::gather_rows(h, prev, upload_i32(arena_, carry_rows));
    ids = run(batch_, h, k);
    for (size_t w = 0; w < still.size(); ++w)
      drafts[static_cast<size_t>(still[w])].push_back(ids[w]);
    wanting = std::move(still);
  }
}

DSparkProposer::DSparkProposer(BlockDraftModel& drafter, int num_pages, int block_size,
                               DType kv_dtype, int num_speculative_tokens, Schedule schedule)
    : drafter_(drafter),
      K_(num_speculative_tokens),
      schedule_(std::move(schedule)),
      profile_(schedule_.sps_table),
      arena_(drafter.device(), 8 << 20) {
  ATOM_CHECK(K_ >= 1 && K_ <= kMaxTokens, "DSpark: {} draft tokens per step (1..{})", K_,
             kMaxTokens);
  if (!schedule_.temperatures.empty() && static_cast<int>(schedule_.temperatures.size()) != K_)
    fail("DSpark's confidence schedule: {} temperatures for {} draft positions",
         schedule_.temperatures.size(), K_);
  kv_ = KvCache::allocate(cache_specs_with_dtype(drafter.cache_specs(), kv_dtype), num_pages,
                          block_size, drafter.device());
}

void DSparkProposer::propose(const Tensor& layer_outputs, std::span<const DraftRequest> reqs,
                             int block_size, std::vector<std::vector<int32_t>>& drafts) {
  drafts.assign(reqs.size(), {});
  // Absorb: every sequence's accepted rows, the target's layer outputs there.
  batch_clear(batch_, block_size);
  std::vector<int32_t> rows;
  for (const DraftRequest& r : reqs) {
    if (r.num_rows <= 0) continue;
    const Sequence& seq = *r.seq;
    batch_add(
        batch_, seq, r.first_pos,
        std::span<const int32_t>(seq.tokens.data() + r.first_pos, static_cast<size_t>(r.num_rows)),
        false);
    for (int j = 0; j < r.num_rows; ++j) rows.push_back(r.first_row + j);
  }
  if (batch_.num_tokens() == 0) return;
  ATOM_CHECK(layer_outputs.defined(),
             "speculative decoding (dspark): the target's runner kept no layer outputs for the "
             "drafter");
  batch_.validate(kv_.num_pages);
  arena_.reset();
  batch_.upload(arena_);
  {
    Tensor index = upload_i32(arena_, rows);
    Tensor in = arena_.alloc({index.numel(), layer_outputs.size(1)}, layer_outputs.dtype());
    kernels::gather_rows(in, layer_outputs, index);
    Step step{batch_, arena_, &kv_};
    drafter_.absorb(step, in);
  }
  // One block per sequence wanting drafts: its anchor (the token after its last accepted row, p)
  // at p + 1, reading the context rows up to p.
  batch_clear(batch_, block_size);
  std::vector<size_t> which;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const DraftRequest& r = reqs[i];
    if (r.num_rows <= 0 || r.num_drafts <= 0) continue;
    const Sequence& seq = *r.seq;
    const int p = r.first_pos + r.num_rows - 1;
    ATOM_CHECK(p + 1 < seq.num_tokens(), "drafter: row {} needs the token after it ({} tokens)", p,
               seq.num_tokens());
    batch_.token_ids.push_back(seq.tokens[static_cast<size_t>(p + 1)]);
    batch_.positions.push_back(p + 1);
    batch_.slot_mapping.push_back(-1);
    batch_.query_start.push_back(batch_.num_tokens());
    batch_.context_lens.push_back(p + 1);
    const int pages = (p + 1 + block_size - 1) / block_size;
    ATOM_CHECK(static_cast<int>(seq.block_table.size()) >= pages,
               "drafter: positions up to {} with {} blocks", p, seq.block_table.size());
    batch_.page_indices.insert(batch_.page_indices.end(), seq.block_table.begin(),
                               seq.block_table.begin() + pages);
    batch_.page_indptr.push_back(static_cast<int32_t>(batch_.page_indices.size()));
    batch_.max_query_len = 1;
    batch_.max_context_len = std::max(batch_.max_context_len, p + 1);
    which.push_back(i);
  }
  if (which.empty()) return;
  batch_.validate(kv_.num_pages);
  arena_.reset();
  batch_.upload(arena_);
  Step step{batch_, arena_, &kv_};
  const BlockDraftModel::Block block = drafter_.draft_block(step, K_);
  // The confidence schedule: each block's confidences, positions past what its sequence wants at
  // 0 (never verified), calibrated, then every block's verify length at once.
  std::vector<int> keep;
  if (schedule_.on) {
    ATOM_CHECK(block.confidence.size() == which.size() * static_cast<size_t>(K_),
               "DSpark: {} confidences for {} blocks of {}", block.confidence.size(), which.size(),
               K_);
    std::vector<float> c(block.confidence);
    confidence_calibrate(c, K_, schedule_.temperatures);
    for (size_t w = 0; w < which.size(); ++w)
      for (int k = reqs[which[w]].num_drafts; k < K_; ++k) c[w * K_ + static_cast<size_t>(k)] = 0;
    keep = verify_lengths_schedule(c, static_cast<int>(which.size()), K_, profile_);
  }
  for (size_t w = 0; w < which.size(); ++w) {
    int n = std::min(K_, reqs[which[w]].num_drafts);
    if (schedule_.on) {
      drafted_ += n;
      n = std::min(n, keep[w]);
      kept_ += n;
    }
    drafts[which[w]].assign(block.tokens.begin() + static_cast<int64_t>(w) * K_,
                            block.tokens.begin() + static_cast<int64_t>(w) * K_ + n);
  }
}

std::string spec_decode_stats_line(int64_t drafts, int64_t draft_tokens, int64_t accepted,
                                   const std::vector<int64_t>& per_position) {
  const double n = static_cast<double>(std::max<int64_t>(drafts, 1));
  std::string pos;
  for (int64_t a : per_position) pos += fmt::format("{}{:.2f}", pos.empty() ? "" : " ", a / n);
  return fmt::format(
      "mean acceptance length {:.2f}, accepted {} per position, {} drafts, {} draft tokens, {} "
      "accepted",
      1.0 + static_cast<double>(accepted) / n, pos, drafts, draft_tokens, accepted);
}

void speculative_config_parse(const std::string& text, EngineConfig& c) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("--speculative-config is not valid JSON ({}): {}", e.what(), text);
  }
  if (!j.is_object()) fail("--speculative-config must be a JSON object, got {}", text);
  std::string method;
  int k = -1;
  bool schedule = false;
  std::vector<float> temperatures;
  std::vector<std::pair<int, double>> sps;
  for (const auto& [key, v] : j.items()) {
    if (key == "method") {
      if (!v.is_string()) fail("--speculative-config: 'method' must be a string, got {}", v.dump());
      method = v.get<std::string>();
    } else if (key == "num_speculative_tokens") {
      if (!v.is_number_integer())
        fail("--speculative-config: 'num_speculative_tokens' must be an integer, got {}", v.dump());
      k = v.get<int>();
    } else if (key == "confidence_schedule") {
      if (!v.is_boolean())
        fail("--speculative-config: 'confidence_schedule' must be true or false, got {}", v.dump());
      schedule = v.get<bool>();
    } else if (key == "sts_temperatures") {
      if (!v.is_array())
        fail("--speculative-config: 'sts_temperatures' must be an array of numbers, got {}",
             v.dump());
      for (const auto& t : v) {
        if (!t.is_number() || !(t.get<double>() > 0) || !std::isfinite(t.get<double>()))
          fail("--speculative-config: 'sts_temperatures' must hold positive numbers, got {}",
               t.dump());
        temperatures.push_back(t.get<float>());
      }
    } else if (key == "sps_table") {
      if (!v.is_array() || v.empty())
        fail("--speculative-config: 'sps_table' must be a non-empty array of [tokens, steps per "
             "second] pairs, got {}",
             v.dump());
      for (const auto& p : v) {
        if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() ||
            p[0].get<int64_t>() < 1 || p[0].get<int64_t>() > (1 << 30) || !p[1].is_number() ||
            !(p[1].get<double>() > 0) || !std::isfinite(p[1].get<double>()))
          fail("--speculative-config: 'sps_table' entries must be [tokens >= 1, steps per second "
               "> 0], got {}",
               p.dump());
        for (const auto& [b, _] : sps)
          if (b == p[0].get<int>())
            fail("--speculative-config: 'sps_table' lists {} tokens twice", b);
        sps.emplace_back(p[0].get<int>(), p[1].get<double>());
      }
    } else {
      fail("--speculative-config: unknown key '{}' (known: method, num_speculative_tokens, "
           "confidence_schedule, sts_temperatures, sps_table)",
           key);
    }
  }
  if (method != "mtp" && method != "dspark")
    fail("--speculative-config: method '{}' is not supported (supported: mtp, the MTP layers in "
         "the target's checkpoint; dspark, DeepSeek-V4.1's DSpark block drafter in it)",
         method);
  const int max_k = method == "dspark" ? DSparkProposer::kMaxTokens : 4;
  if (k < 1 || k > max_k)
    fail(
        "--speculative-config: 'num_speculative_tokens' must be in 1..{}, got {} (method {})",
        max_k,
        k < 0 && !j.contains("num_speculative_tokens") ? std::string("nothing") : std::to_string(k),
        method);
  if (schedule && method != "dspark")
    fail("--speculative-config: 'confidence_schedule' needs method 'dspark' (a drafter with a "
         "confidence head), not '{}'",
         method);
  if (!schedule && (j.contains("sts_temperatures") || j.contains("sps_table")))
    fail("--speculative-config: 'sts_temperatures' and 'sps_table' need 'confidence_schedule': "
         "true");
  if (j.contains("sts_temperatures") && static_cast<int>(temperatures.size()) != k)
    fail("--speculative-config: 'sts_temperatures' must hold one temperature per draft position, "
         "{} (num_speculative_tokens), got {}",
         k, temperatures.size());
  c.speculative_method = method;
  c.num_speculative_tokens = k;
  c.spec_confidence_schedule = schedule;
  c.spec_sts_temperatures = std::move(temperatures);
  c.spec_sps_table = std::move(sps);
}

}  // namespace atom
