// The seam through which structured output constrains decoding: a request's sampling parameters
// may carry a LogitsConstraint (a compiled grammar, say); each of its sequences gets a state that,
// before every draw, names the tokens allowed next and, after it, takes the token drawn. The engine
// knows nothing else about grammars (src/grammar implements this).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

namespace atom {

class LogitsConstraintState {
 public:
  virtual ~LogitsConstraintState() = default;
  // Sets bit t (allowed[t / 64] >> (t % 64)) for every token t the constraint allows next, the
  // end-of-sequence ids included once the output is complete; `allowed` arrives zeroed, sized for
  // the model's vocabulary.
  virtual void fill_allowed(std::span<uint64_t> allowed, std::span<const int32_t> eos_ids) = 0;
  // Advances past the token drawn; false when it was not allowed (the engine then ends the
  // sequence with an error rather than emit text outside the grammar).
  virtual bool accept(int32_t token) = 0;
  // The output is complete and nothing but the end of sequence may follow.
  virtual bool must_end() const = 0;
};

class LogitsConstraint {
 public:
  virtual ~LogitsConstraint() = default;
  // A fresh state at the start of the output.
  virtual std::unique_ptr<LogitsConstraintState> start() const = 0;
};

}  // namespace atom
