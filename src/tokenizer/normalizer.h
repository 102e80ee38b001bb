// Normalizers of tokenizer.json (NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents, Replace,
// Prepend, Nmt, BertNormalizer, ByteLevel, Sequence).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/json_util.h"

namespace atom::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites s. at_origin is cleared when characters at the very start were dropped, which moves
  // the piece's first character away from offset 0 of the input (Metaspace prepend_scheme
  // "first" looks at that).
  virtual void normalize(std::string& s, bool& at_origin) const = 0;
};

// Builds the normalizer described by j; `where` names it in errors. Returns null for JSON null.
std::unique_ptr<Normalizer> normalizer_from_json(const Json& j, const std::string& where);

}  // namespace atom::tokenizer
