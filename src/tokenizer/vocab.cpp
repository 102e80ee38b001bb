#include "tokenizer/vocab.h"

#include <functional>

#include "core/error.h"

namespace atom::tokenizer {

static size_t hash_text(std::string_view s) { return std::hash<std::string_view>{}(s); }

void TokenTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap > slots_.size()) {
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(cap, Entry{});
    for (const Entry& e : old) {
      if (e.id < 0) continue;
      const std::string_view t(arena_.data() + e.off, e.len);
      slots_[slot_of(t, hash_text(t))] = e;
    }
  }
}

void TokenTable::grow() { reserve(slots_.empty() ? 8 : slots_.size()); }

size_t TokenTable::slot_of(std::string_view text, size_t hash) const {
  size_t i = hash & (slots_.size() - 1);
  while (true) {
    const Entry& e = slots_[i];
    if (e.id < 0) return i;
    if (e.len == text.size() && std::string_view(arena_.data() + e.off, e.len) == text) return i;
    i = (i + 1) & (slots_.size() - 1);
  }
}

void TokenTable::add(std::string_view text, int32_t id) {
  ATOM_CHECK(id >= 0, "token id {} is negative", id);
  ATOM_CHECK(id <= kMaxTokenId, "token id {} is beyond the largest atom accepts ({})", id,
             kMaxTokenId);
  if ((count_ + 1) * 2 > slots_.size()) grow();
  const size_t h = hash_text(text);
  Entry& e = slots_[slot_of(text, h)];
  if (e.id < 0) {
    e.off = static_cast<uint32_t>(arena_.size());
    e.len = static_cast<uint32_t>(text.size());
    arena_.append(text);
    ++count_;
  } else if (e.id != id) {
    id_off_[static_cast<size_t>(e.id)] = {0, 0};  // the old id loses its text, as in HF's vocab_r
  }
  e.id = id;
  if (static_cast<size_t>(id) >= id_off_.size())
    id_off_.resize(static_cast<size_t>(id) + 1, {0, 0});
  id_off_[static_cast<size_t>(id)] = {e.off, e.len + 1};
}

int32_t TokenTable::find(std::string_view text) const {
  if (slots_.empty()) return -1;
  size_t i = hash_text(text) & (slots_.size() - 1);
  while (true) {
    const Entry& e = slots_[i];
    if (e.id < 0) return -1;
    if (e.len == text.size() && std::string_view(arena_.data() + e.off, e.len) == text) return e.id;
    i = (i + 1) & (slots_.size() - 1);
  }
}

bool TokenTable::has_id(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < id_off_.size() &&
         id_off_[static_cast<size_t>(id)].second != 0;
}

std::string_view TokenTable::text(int32_t id) const {
  if (!has_id(id)) return {};
  const auto [off, len1] = id_off_[static_cast<size_t>(id)];
  return std::string_view(arena_.data() + off, len1 - 1);
}

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    size_t i = mix(s.key) & (cap - 1);
    while (slots_[i].key != kEmpty) i = (i + 1) & (cap - 1);
    slots_[i] = s;
  }
}

void MergeTable::grow() { reserve(slots_.empty() ? 8 : slots_.size()); }

void MergeTable::insert(int32_t a, int32_t b, Value v) {
  if ((count_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = pack(a, b);
  size_t i = mix(key) & (slots_.size() - 1);
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & (slots_.size() - 1);
  if (slots_[i].key == kEmpty) ++count_;
  slots_[i].key = key;
  slots_[i].value = v;
}

}  // namespace atom::tokenizer
