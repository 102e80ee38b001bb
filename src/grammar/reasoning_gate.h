// Structured output for reasoning models (vLLM's default with a reasoning parser): the reasoning
// block is written freely and the grammar applies from the token after it ends. The block's tags
// are single tokens in the tokenizers of the families that reason this way (Qwen3's <think> and
// </think>, DeepSeek-R1/V3's, GLM-4.5's), and the gate works on those ids.
//   - starts_in_reasoning (the prompt opened the block): every token is allowed until end_id; the
//     grammar starts after it.
//   - otherwise the first token may open the block (start_id) or begin the constrained answer: the
//     first draw allows the grammar's tokens and start_id; start_id leads to the free block, any
//     other token is the grammar's first.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/logits_constraint.h"

namespace atom::grammar {

class ReasoningGate final : public LogitsConstraint {
 public:
  // start_id < 0: the output cannot open a block (only starts_in_reasoning gates).
  ReasoningGate(std::shared_ptr<const LogitsConstraint> inner, int32_t start_id, int32_t end_id,
                bool starts_in_reasoning);
  std::unique_ptr<LogitsConstraintState> start() const override;

 private:
  std::shared_ptr<const LogitsConstraint> inner_;
  int32_t start_id_, end_id_;
  bool starts_in_reasoning_;
};

}  // namespace atom::grammar
