#include "engine/spec_decode.h"

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/sampling.h"

namespace atom {

MtpProposer::MtpProposer(DraftModel& drafter, int num_pages, int block_size, DType kv_dtype)
    : drafter_(drafter), arena_(drafter.device(), 8 << 20) {
  kv_ = KvCache::allocate(cache_specs_with_dtype(drafter.cache_specs(), kv_dtype), num_pages,
                          block_size, drafter.device());
}

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
}  // namespace

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
  drafts.assign(reqs.size(), {});
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
    batch_add(batch_,
              seq, r.first_pos,
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
  for (size_t w = 0; w < wanting.size(); ++w) drafts[static_cast<size_t>(wanting[w])].push_back(ids[w]);
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
    for (size_t w = 0; w < still.size(); ++w) drafts[static_cast<size_t>(still[w])].push_back(ids[w]);
    wanting = std::move(still);
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
  for (const auto& [key, v] : j.items()) {
    if (key == "method") {
      if (!v.is_string()) fail("--speculative-config: 'method' must be a string, got {}", v.dump());
      method = v.get<std::string>();
    } else if (key == "num_speculative_tokens") {
      if (!v.is_number_integer())
        fail("--speculative-config: 'num_speculative_tokens' must be an integer, got {}", v.dump());
      k = v.get<int>();
    } else {
      fail("--speculative-config: unknown key '{}' (known: method, num_speculative_tokens)", key);
    }
  }
  if (method != "mtp")
    fail("--speculative-config: method '{}' is not supported (supported: mtp, the drafter in "
         "the target's checkpoint)",
         method);
  if (k < 1 || k > 4)
    fail("--speculative-config: 'num_speculative_tokens' must be in 1..4, got {}",
         k < 0 && !j.contains("num_speculative_tokens") ? std::string("nothing")
                                                         : std::to_string(k));
  c.speculative_method = method;
  c.num_speculative_tokens = k;
}

}  // namespace atom
