#include "layers/batch.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "core/error.h"

namespace atom {

void Batch::validate(int64_t num_pages, int64_t num_state_slots) const {
  const int T = num_tokens(), S = num_seqs();
  auto check_extent = [&](const char* name, const std::vector<int32_t>& f, BatchExtent e) {
    const int n = static_cast<int>(f.size());
    const bool tokens = e == BatchExtent::kTokens || e == BatchExtent::kTokensOrNone;
    const int want = tokens ? T : e == BatchExtent::kSeqsPlus1 ? S + 1 : S;
    const bool or_none = e == BatchExtent::kSeqsOrNone || e == BatchExtent::kTokensOrNone;
    ATOM_CHECK(e == BatchExtent::kFree || n == want || (or_none && n == 0),
               "batch: {} has {} entries, expected {}", name, n, want);
  };
#define ATOM_BATCH_CHECK_FIELD(name, extent) check_extent(#name, name, extent);
  ATOM_BATCH_FIELDS(ATOM_BATCH_CHECK_FIELD)
#undef ATOM_BATCH_CHECK_FIELD
  ATOM_CHECK(query_start[0] == 0 && query_start[S] == T,
             "batch: query_start must run from 0 to num_tokens");
  ATOM_CHECK(page_indptr[0] == 0 && page_indptr[S] == static_cast<int>(page_indices.size()),
             "batch: page_indptr must cover page_indices");
  for (int s = 0; s < S; ++s) {
    const int q = query_start[s + 1] - query_start[s];
    ATOM_CHECK(q >= 0 && q <= context_lens[s],
               "batch: sequence {} has {} new tokens but context {}", s, q, context_lens[s]);
    const int pages = page_indptr[s + 1] - page_indptr[s];
    ATOM_CHECK(pages >= 0, "batch: page_indptr decreases at sequence {}", s);
    ATOM_CHECK(static_cast<int64_t>(pages) * block_size >= context_lens[s],
               "batch: sequence {} has {} pages for {} tokens", s, pages, context_lens[s]);
  }
  for (int32_t i : logits_indices)
    ATOM_CHECK(i >= 0 && i < T, "batch: logits index {} out of range", i);
  if (num_pages >= 0) {
    for (int32_t p : page_indices)
      ATOM_CHECK(p >= 0 && p < num_pages, "batch: page index {} outside the cache's {} pages", p,
                 num_pages);
    const int64_t slots = num_pages * block_size;
    for (int32_t t : slot_mapping)
      ATOM_CHECK(t >= -1 && t < slots, "batch: cache slot {} outside the cache's {} slots", t,
                 slots);
  }
  if (num_state_slots >= 0) {
    for (int32_t slot : state_slots)
      ATOM_CHECK(slot >= 0 && slot < num_state_slots,
                 "batch: state slot {} outside the pool's {} slots", slot, num_state_slots);
    for (int32_t slot : state_rollback_slots)
      ATOM_CHECK(slot >= -1 && slot < num_state_slots,
                 "batch: rollback state slot {} outside the pool's {} slots", slot,
                 num_state_slots);
  }
}

void Batch::upload(Arena& arena, int64_t page_capacity) {
  max_query_len = 0;
  max_context_len = 0;
  for (int s = 0; s < num_seqs(); ++s) {
    max_query_len = std::max(max_query_len, query_start[s + 1] - query_start[s]);
    max_context_len = std::max(max_context_len, context_lens[s]);
  }
  // In ATOM_BATCH_FIELDS order: page_indices last, so that room reserved for more pages sits
  // past everything else.
#define ATOM_BATCH_HOST_PTR(name, extent) &name,
#define ATOM_BATCH_VIEW_PTR(name, extent) &dev.name,
  const std::vector<int32_t>* fields[] = {ATOM_BATCH_FIELDS(ATOM_BATCH_HOST_PTR)};
  Tensor* views[] = {ATOM_BATCH_FIELDS(ATOM_BATCH_VIEW_PTR)};
#undef ATOM_BATCH_HOST_PTR
#undef ATOM_BATCH_VIEW_PTR
  static_assert(std::size(fields) == std::size(views));
  int64_t used = 0;
  for (const auto* f : fields) used += static_cast<int64_t>(f->size());
  const int64_t pages = static_cast<int64_t>(page_indices.size());
  Tensor all = arena.alloc({used + std::max<int64_t>(0, page_capacity - pages)}, DType::kI32);
  // On the CPU the fields are packed straight into the arena; otherwise into a host buffer kept
  // across steps, then copied in one transfer.
  const bool host = arena.device().is_cpu();
  if (!host) upload_staging.resize(static_cast<size_t>(used));
  int32_t* dst = host ? all.ptr<int32_t>() : upload_staging.data();
  int64_t off = 0;
  for (const auto* f : fields) {
    if (!f->empty()) std::memcpy(dst + off, f->data(), f->size() * 4);
    off += static_cast<int64_t>(f->size());
  }
  if (!host)
    memory_copy(all.data(), arena.device(), dst, Device::cpu(), static_cast<size_t>(used) * 4);
  off = 0;
  for (size_t i = 0; i < std::size(fields); ++i) {
    const int64_t n = static_cast<int64_t>(fields[i]->size());
    *views[i] = all.narrow(0, off, n);
    off += n;
  }
}

void Batch::copy_host_from(const Batch& from) {
#define ATOM_BATCH_COPY_FIELD(name, extent) name = from.name;
  ATOM_BATCH_FIELDS(ATOM_BATCH_COPY_FIELD)
#undef ATOM_BATCH_COPY_FIELD
  block_size = from.block_size;
  state_copies = from.state_copies;
  input_embeds = from.input_embeds;
}

std::shared_ptr<const InputEmbeds> input_embeds_window(const InputEmbeds& e, int64_t start,
                                                       int64_t n) {
  auto w = std::make_shared<InputEmbeds>();
  for (const InputEmbeds::Run& r : e.runs) {
    const int64_t lo = std::max(r.dst_row, start);
    const int64_t hi = std::min(r.dst_row + r.values.size(0), start + n);
    if (lo < hi) w->runs.push_back({lo - start, r.values.narrow(0, lo - r.dst_row, hi - lo)});
  }
  if (w->runs.empty()) return nullptr;
  return w;
}

Batch Batch::slice(int first, int last) const {
  const int S = num_seqs();
  ATOM_CHECK(0 <= first && first < last && last <= S, "batch: slice [{}, {}) of {} sequences",
             first, last, S);
  ATOM_CHECK(std::is_sorted(logits_indices.begin(), logits_indices.end()),
             "batch: a batch whose logits rows do not ascend cannot be sliced");
  Batch b;
  const int t0 = query_start[first], t1 = query_start[last];
  const int p0 = page_indptr[first], p1 = page_indptr[last];
  auto cut = [](const std::vector<int32_t>& f, int from, int to) {
    return f.empty() ? f : std::vector<int32_t>(f.begin() + from, f.begin() + to);
  };
  auto rebased = [](const std::vector<int32_t>& f, int from, int to) {
    std::vector<int32_t> r(f.begin() + from, f.begin() + to + 1);
    const int32_t base = r.front();
    for (int32_t& v : r) v -= base;
    return r;
  };
  auto take = [&](const std::vector<int32_t>& f, BatchExtent e) {
    switch (e) {
      case BatchExtent::kTokens:
      case BatchExtent::kTokensOrNone:
        return cut(f, t0, t1);
      case BatchExtent::kSeqs:
      case BatchExtent::kSeqsOrNone:
        return cut(f, first, last);
      default:
        return std::vector<int32_t>();  // the offsets and free fields: below
    }
  };
#define ATOM_BATCH_SLICE_FIELD(name, extent) b.name = take(name, extent);
  ATOM_BATCH_FIELDS(ATOM_BATCH_SLICE_FIELD)
#undef ATOM_BATCH_SLICE_FIELD
  b.query_start = rebased(query_start, first, last);
  b.page_indptr = rebased(page_indptr, first, last);
  b.page_indices = cut(page_indices, p0, p1);
  for (const int32_t i : logits_indices)
    if (i >= t0 && i < t1) b.logits_indices.push_back(i - t0);
  b.block_size = block_size;
  if (input_embeds) b.input_embeds = input_embeds_window(*input_embeds, t0, t1 - t0);
  return b;
}

Batch Batch::page_share(int first_page, int num_pages, std::vector<int32_t>& rows,
                        std::vector<int32_t>& scatter) const {
  const int S = num_seqs(), T = num_tokens();
  ATOM_CHECK(first_page >= 0 && num_pages > 0, "batch: a share of pages [{}, +{})", first_page,
             num_pages);
  const int64_t end_page = static_cast<int64_t>(first_page) + num_pages;
  auto in_share = [&](int32_t p) { return p >= first_page && p < end_page; };
  // The share's sequences, their rows and their pages (rebased) with the offsets into both.
  std::vector<int> seqs;
  std::vector<int32_t> starts{0}, pages, indptr{0};
  rows.clear();
  for (int s = 0; s < S; ++s) {
    const int p0 = page_indptr[s], p1 = page_indptr[s + 1];
    const bool mine = p0 < p1 && in_share(page_indices[p0]);
    for (int i = p0; i < p1; ++i)
      ATOM_CHECK(in_share(page_indices[i]) == mine,
                 "batch: sequence {} holds pages inside and outside the share [{}, {})", s,
                 first_page, end_page);
    if (!mine) continue;
    for (int i = p0; i < p1; ++i) pages.push_back(page_indices[i] - first_page);
    indptr.push_back(static_cast<int32_t>(pages.size()));
    for (int t = query_start[s]; t < query_start[s + 1]; ++t) rows.push_back(t);
    starts.push_back(static_cast<int32_t>(rows.size()));
    seqs.push_back(s);
  }
  const int L = static_cast<int>(rows.size());
  scatter.assign(static_cast<size_t>(T), L);
  for (int i = 0; i < L; ++i) scatter[static_cast<size_t>(rows[static_cast<size_t>(i)])] = i;
  auto take = [&](const std::vector<int32_t>& f, BatchExtent e) {
    std::vector<int32_t> r;
    if (f.empty()) return r;
    switch (e) {
      case BatchExtent::kTokens:
      case BatchExtent::kTokensOrNone:
        for (int32_t t : rows) r.push_back(f[static_cast<size_t>(t)]);
        break;
      case BatchExtent::kSeqs:
      case BatchExtent::kSeqsOrNone:
        for (int s : seqs) r.push_back(f[static_cast<size_t>(s)]);
        break;
      default:
        break;  // the offsets and free fields: below
    }
    return r;
  };
  Batch b;
#define ATOM_BATCH_SHARE_FIELD(name, extent) b.name = take(name, extent);
  ATOM_BATCH_FIELDS(ATOM_BATCH_SHARE_FIELD)
#undef ATOM_BATCH_SHARE_FIELD
  b.block_size = block_size;
  b.query_start = std::move(starts);
  b.page_indptr = std::move(indptr);
  b.page_indices = std::move(pages);
  const int64_t first_slot = static_cast<int64_t>(first_page) * block_size;
  for (int32_t& slot : b.slot_mapping)
    if (slot >= 0) slot = static_cast<int32_t>(slot - first_slot);
  for (int32_t i : logits_indices)
    if (scatter[static_cast<size_t>(i)] < L)
      b.logits_indices.push_back(scatter[static_cast<size_t>(i)]);
  return b;
}

}  // namespace atom
