#include "tokenizer/pre_tokenizer.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/scratch.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

SplitBehavior split_behavior_from_json(const Json& j, const std::string& where) {
  if (!j.is_string()) fail("{}.behavior: expected a string", where);
  const std::string b = j.get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  fail("{}.behavior: unknown split behavior \"{}\" (expected Removed, Isolated, "
       "MergedWithPrevious, MergedWithNext or Contiguous)",
       where, b);
}

void split_apply(const PreToken& piece, std::vector<SplitRange>& r, SplitBehavior behavior,
                 std::vector<PreToken>& out) {
  // Merge ranges the way HF's NormalizedString::split folds them; afterwards is_match marks the
  // ranges to drop.
  size_t n = 0;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto& x : r) x.is_match = false;
      n = r.size();
      break;
    case SplitBehavior::kRemoved:
      n = r.size();
      break;
    case SplitBehavior::kContiguous:
    case SplitBehavior::kMergedWithPrevious: {
      bool prev = false;
      for (size_t i = 0; i < r.size(); ++i) {
        const bool m = r[i].is_match;
        const bool join = behavior == SplitBehavior::kContiguous ? (m == prev) : (m && !prev);
        if (join && n > 0) {
          r[n - 1].end = r[i].end;
        } else {
          r[n++] = {r[i].start, r[i].end, false};
        }
        prev = m;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Fold from the right: a match joins the range after it.
      bool prev = false;
      std::vector<SplitRange> acc;
      for (size_t k = r.size(); k-- > 0;) {
        const bool m = r[k].is_match;
        if (m && !prev && !acc.empty()) {
          acc.back().start = r[k].start;
        } else {
          acc.push_back({r[k].start, r[k].end, false});
        }
        prev = m;
      }
      n = acc.size();
      for (size_t i = 0; i < n; ++i) r[i] = acc[n - 1 - i];
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (r[i].is_match || r[i].end == r[i].start) continue;
    out.push_back(
        {piece.text.substr(r[i].start, r[i].end - r[i].start), piece.at_origin && r[i].start == 0});
  }
}

namespace {

// Ranges for a per-character predicate: every matching character is its own match.
template <typename Pred>
void char_ranges(const std::string& s, Pred pred, std::vector<SplitRange>& out) {
  out.clear();
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t c = utf8_next(s, i);
    if (pred(c)) {
      if (last < start) out.push_back({last, start, false});
      out.push_back({start, i, true});
      last = i;
    }
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
}

void regex_ranges(const Regex& re, const std::string& s, bool invert,
                  std::vector<SplitRange>& out) {
  thread_local std::vector<std::pair<size_t, size_t>> m;
  const ReleaseOnExit release(m);
  re.find_all(s, m);
  out.clear();
  size_t prev = 0;
  for (auto [a, b] : m) {
    if (prev != a) out.push_back({prev, a, invert});
    out.push_back({a, b, !invert});
    prev = b;
  }
  if (prev != s.size()) out.push_back({prev, s.size(), invert});
}

void literal_ranges(const std::string& lit, const std::string& s, bool invert,
                    std::vector<SplitRange>& out) {
  out.clear();
  size_t prev = 0;
  for (size_t m = s.find(lit); m != std::string::npos; m = s.find(lit, m + lit.size())) {
    if (prev != m) out.push_back({prev, m, invert});
    out.push_back({m, m + lit.size(), !invert});
    prev = m + lit.size();
  }
  if (prev != s.size()) out.push_back({prev, s.size(), invert});
}

// Runs fn(piece, out) on every piece.
template <typename Fn>
void for_each_piece(std::vector<PreToken>& pieces, Fn fn) {
  thread_local std::vector<PreToken> out;
  out.clear();
  out.reserve(pieces.size() * 4);
  for (const PreToken& p : pieces) fn(p, out);
  pieces.swap(out);
  out.clear();  // the previous pieces
  release_if_large(out);
}

class SplitPre final : public PreTokenizer {
 public:
  SplitPre(const Json& j, const std::string& where) {
    const Json& pat = json_field(j, "pattern", where);
    if (pat.is_object() && pat.contains("String")) {
      literal_ = json_string(pat, "String", where + ".pattern");
      if (literal_.empty()) regex_ = std::make_unique<Regex>("", where + ".pattern");
    } else if (pat.is_object() && pat.contains("Regex")) {
      regex_ = std::make_unique<Regex>(json_string(pat, "Regex", where + ".pattern"),
                                       where + ".pattern");
    } else {
      fail("{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
    }
    behavior_ = split_behavior_from_json(json_field(j, "behavior", where), where);
    invert_ = json_bool(j, "invert", false, where);
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for_each_piece(pieces, [&](const PreToken& p, std::vector<PreToken>& out) {
      thread_local std::vector<SplitRange> r;
      const ReleaseOnExit release(r);
      if (regex_) {
        regex_ranges(*regex_, p.text, invert_, r);
      } else {
        literal_ranges(literal_, p.text, invert_, r);
      }
      split_apply(p, r, behavior_, out);
    });
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPre final : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    static const Regex gpt2(
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
        "ByteLevel pre-tokenizer");
    for_each_piece(pieces, [&](const PreToken& p, std::vector<PreToken>& out) {
      thread_local PreToken prefixed;
      const ReleaseOnExit release_prefixed(prefixed.text);
      const PreToken* src = &p;
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) {
        prefixed.text.clear();
        prefixed.text.push_back(' ');
        prefixed.text.append(p.text);
        prefixed.at_origin = p.at_origin;
        src = &prefixed;
      }
      const size_t first = out.size();
      if (use_regex_) {
        thread_local std::vector<SplitRange> r;
        const ReleaseOnExit release(r);
        regex_ranges(gpt2, src->text, false, r);
        split_apply(*src, r, SplitBehavior::kIsolated, out);
      } else if (!src->text.empty()) {
        out.push_back(*src);
      }
      thread_local std::string mapped;
      const ReleaseOnExit release_mapped(mapped);
      for (size_t i = first; i < out.size(); ++i) {
        mapped.clear();
        byte_level_encode(out[i].text, mapped);
        out[i].text.swap(mapped);
      }
    });
  }

 private:
  bool add_prefix_space_, use_regex_;
};

class MetaspacePre final : public PreTokenizer {
 public:
  enum class Scheme { kAlways, kFirst, kNever };
  MetaspacePre(std::string replacement, Scheme scheme, bool split)
      : rep_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for_each_piece(pieces, [&](const PreToken& p, std::vector<PreToken>& out) {
      PreToken q{std::string(), p.at_origin};
      q.text.reserve(p.text.size() + rep_.size());
      for (char c : p.text) {
        if (c == ' ') {
          q.text.append(rep_);
        } else {
          q.text.push_back(c);
        }
      }
      const bool starts = q.text.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == Scheme::kAlways || (scheme_ == Scheme::kFirst && p.at_origin))) {
        q.text = rep_ + q.text;
      }
      if (!split_) {
        if (!q.text.empty()) out.push_back(std::move(q));
        return;
      }
      thread_local std::vector<SplitRange> r;
      const ReleaseOnExit release(r);
      literal_ranges(rep_, q.text, false, r);
      split_apply(q, r, SplitBehavior::kMergedWithNext, out);
    });
  }

 private:
  std::string rep_;
  Scheme scheme_;
  bool split_;
};

// Splits by a per-character predicate.
template <typename Pred>
class CharSplitPre final : public PreTokenizer {
 public:
  CharSplitPre(Pred pred, SplitBehavior behavior) : pred_(pred), behavior_(behavior) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for_each_piece(pieces, [&](const PreToken& p, std::vector<PreToken>& out) {
      thread_local std::vector<SplitRange> r;
      const ReleaseOnExit release(r);
      char_ranges(p.text, pred_, r);
      split_apply(p, r, behavior_, out);
    });
  }

 private:
  Pred pred_;
  SplitBehavior behavior_;
};
template <typename Pred>
std::unique_ptr<PreTokenizer> make_char_split(Pred pred, SplitBehavior b) {
  return std::make_unique<CharSplitPre<Pred>>(pred, b);
}

// HF's Whitespace: the regex \w+|[^\w\s]+ keeps runs of word characters and runs of other
// non-space characters, and drops whitespace.
class WhitespacePre final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for_each_piece(pieces, [&](const PreToken& p, std::vector<PreToken>& out) {
      const std::string& s = p.text;
      size_t i = 0;
      while (i < s.size()) {
        size_t j = i;
        const char32_t c = utf8_next(s, j);
        const int cls = uni_is_word_char(c) ? 1 : uni_is_whitespace(c) ? 0 : 2;
        size_t end = j;
        while (end < s.size()) {
          size_t k = end;
          const char32_t d = utf8_next(s, k);
          const int dcls = uni_is_word_char(d) ? 1 : uni_is_whitespace(d) ? 0 : 2;
          if (dcls != cls || cls == 0) break;
          end = k;
        }
        if (cls != 0) out.push_back({s.substr(i, end - i), p.at_origin && i == 0});
        i = end;
      }
    });
  }
};

class FixedLengthPre final : public PreTokenizer {
 public:
  explicit FixedLengthPre(size_t n) : n_(n) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for_each_piece(pieces, [&](const PreToken& p, std::vector<PreToken>& out) {
      size_t i = 0;
      while (i < p.text.size()) {
        const size_t start = i;
        for (size_t k = 0; k < n_ && i < p.text.size(); ++k) {
          i += static_cast<size_t>(utf8_seq_len(static_cast<unsigned char>(p.text[i])));
        }
        out.push_back({p.text.substr(start, i - start), p.at_origin && start == 0});
      }
    });
  }

 private:
  size_t n_;
};

class SequencePre final : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class BertPre final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    ws_->pre_tokenize(pieces);
    punct_->pre_tokenize(pieces);
  }

 private:
  std::unique_ptr<PreTokenizer> ws_ =
      make_char_split([](char32_t c) { return uni_is_whitespace(c); }, SplitBehavior::kRemoved);
  std::unique_ptr<PreTokenizer> punct_ = make_char_split(
      [](char32_t c) { return uni_is_punctuation_or_ascii_punct(c); }, SplitBehavior::kIsolated);
};

}  // namespace

std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_type(j, where);
  if (type == "Split") return std::make_unique<SplitPre>(j, where);
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPre>(json_bool(j, "add_prefix_space", true, where),
                                          json_bool(j, "use_regex", true, where));
  }
  if (type == "Metaspace") {
    const std::u32string rep = json_chars(j, "replacement", where);
    if (rep.size() != 1) fail("{}.replacement: expected a single character", where);
    std::string rep_utf8;
    utf8_append(rep_utf8, rep[0]);
    MetaspacePre::Scheme scheme = MetaspacePre::Scheme::kAlways;
    if (auto ps = json_opt_string(j, "prepend_scheme", where)) {
      if (*ps == "always") {
        scheme = MetaspacePre::Scheme::kAlways;
      } else if (*ps == "first") {
        scheme = MetaspacePre::Scheme::kFirst;
      } else if (*ps == "never") {
        scheme = MetaspacePre::Scheme::kNever;
      } else {
        fail("{}.prepend_scheme: unknown value \"{}\" (expected always, first or never)", where,
             *ps);
      }
    }
    // Old files say add_prefix_space instead; false means never (HF rejects a contradiction).
    if (j.contains("add_prefix_space") && !json_bool(j, "add_prefix_space", true, where)) {
      if (scheme != MetaspacePre::Scheme::kNever && j.contains("prepend_scheme")) {
        fail("{}: add_prefix_space does not match declared prepend_scheme", where);
      }
      scheme = MetaspacePre::Scheme::kNever;
    }
    return std::make_unique<MetaspacePre>(rep_utf8, scheme, json_bool(j, "split", true, where));
  }
  if (type == "Digits") {
    return make_char_split([](char32_t c) { return uni_is_numeric(c); },
                           json_bool(j, "individual_digits", false, where)
                               ? SplitBehavior::kIsolated
                               : SplitBehavior::kContiguous);
  }
  if (type == "Punctuation") {
    SplitBehavior b = SplitBehavior::kIsolated;
    if (auto it = j.find("behavior"); it != j.end()) b = split_behavior_from_json(*it, where);
    return make_char_split([](char32_t c) { return uni_is_punctuation_or_ascii_punct(c); }, b);
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePre>();
  if (type == "WhitespaceSplit") {
    return make_char_split([](char32_t c) { return uni_is_whitespace(c); },
                           SplitBehavior::kRemoved);
  }
  if (type == "BertPreTokenizer") return std::make_unique<BertPre>();
  if (type == "CharDelimiterSplit") {
    const std::u32string d = json_chars(j, "delimiter", where);
    if (d.size() != 1) fail("{}.delimiter: expected a single character", where);
    const char32_t delim = d[0];
    return make_char_split([delim](char32_t c) { return c == delim; }, SplitBehavior::kRemoved);
  }
  if (type == "FixedLength") {
    size_t n = 5;
    if (auto it = j.find("length"); it != j.end())
      n = static_cast<size_t>(json_int(j, "length", where));
    if (n == 0) fail("{}.length: must be positive", where);
    return std::make_unique<FixedLengthPre>(n);
  }
  if (type == "Sequence") {
    const Json& list = json_field(j, "pretokenizers", where);
    if (!list.is_array()) fail("{}.pretokenizers: expected an array", where);
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = pre_tokenizer_from_json(list[i], fmt::format("{}.pretokenizers[{}]", where, i));
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePre>(std::move(parts));
  }
  fail("{}: pre-tokenizer type \"{}\" is not supported by atom (supported: Split, ByteLevel, "
       "Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer, "
       "CharDelimiterSplit, FixedLength, Sequence)",
       where, type);
}

}  // namespace atom::tokenizer
