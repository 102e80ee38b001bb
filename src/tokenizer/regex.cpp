#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {

// Oniguruma's \s (with a Unicode encoding) is [\t-\r\x85] plus the Z categories; PCRE2's UCP \s
// also admits U+180E. \h in Ruby syntax is a hex digit, not horizontal space. Everything else the
// tokenizer patterns use (\p{..}, (?i:..), lookahead, {m,n}) means the same in both.
std::string regex_onig_to_pcre2(std::string_view p) {
  static constexpr std::string_view kSpaceItems = "\\t-\\r\\x{85}\\p{Z}";
  std::string out;
  out.reserve(p.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        if (class_depth > 0) {
          out.append(kSpaceItems);
        } else {
          out.append("[").append(kSpaceItems).append("]");
        }
      } else if (n == 'S' && class_depth == 0) {
        out.append("[^").append(kSpaceItems).append("]");
      } else if (n == 'h') {
        out.append(class_depth > 0 ? "0-9a-fA-F" : "[0-9a-fA-F]");
      } else if (n == 'H' && class_depth == 0) {
        out.append("[^0-9a-fA-F]");
      } else {
        out.push_back(c);
        out.push_back(n);
      }
      ++i;
      continue;
    }
    if (c == '[') {
      // A '[' inside a class opens a nested class in Ruby syntax; "[]" and "[^]" keep a literal ].
      ++class_depth;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
};

Regex::Regex(std::string_view pattern, std::string_view what)
    : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  const std::string rewritten = regex_onig_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // MULTILINE: Ruby's ^ and $ match at line boundaries.
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NO_UTF_CHECK, &err,
                              &err_off, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    fail("{}: cannot compile regex {:?}: {} at offset {}", what, std::string(pattern),
         reinterpret_cast<const char*>(buf), err_off);
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

namespace {
// Per-thread match state shared by every pattern: only the whole-match offsets are read, so match
// data for one pair fits any pattern; the JIT stack may grow to 16 MB for very long inputs.
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
  MatchState() { pcre2_jit_stack_assign(mc, nullptr, stack); }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};
}  // namespace

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  thread_local MatchState st;
  pcre2_match_data* md = st.md;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  bool have_last_end = false;
  size_t last_end = 0;
  while (pos <= s.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, s.size(), pos, 0, md, st.mc)
                              : pcre2_match(impl_->code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK,
                                            md, st.mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      fail("regex {:?} failed while matching: {}", pattern_, reinterpret_cast<const char*>(buf));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (start == end && have_last_end && last_end == end) {
      // Oniguruma's iterator: skip one character and search again.
      if (pos >= s.size()) break;
      pos += utf8_seq_len(static_cast<unsigned char>(s[pos]));
      continue;
    }
    out.emplace_back(start, end);
    have_last_end = true;
    last_end = end;
    pos = end;
    if (start == end) {
      // An empty match: the next search starts at the same place and will be skipped above.
      continue;
    }
  }
}

}  // namespace atom::tokenizer
