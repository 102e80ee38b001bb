// Post-processors of tokenizer.json: what "add_special_tokens" adds around the encoded ids
// (TemplateProcessing, BertProcessing, RobertaProcessing; ByteLevel only trims offsets, which atom
// does not compute, so it leaves ids as they are).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_util.h"

namespace atom::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Single-sequence processing of ids in place.
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

std::unique_ptr<PostProcessor> post_processor_from_json(const Json& j, const std::string& where);

}  // namespace atom::tokenizer
