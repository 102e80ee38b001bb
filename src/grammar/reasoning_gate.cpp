#include "grammar/reasoning_gate.h"

#include <algorithm>

namespace atom::grammar {

namespace {

class GateState final : public LogitsConstraintState {
 public:
  enum class Phase { kFirst, kReasoning, kAnswer };
  GateState(std::shared_ptr<const LogitsConstraint> inner, int32_t start_id, int32_t end_id,
            bool starts_in_reasoning)
      : inner_(std::move(inner)),
        start_id_(start_id),
        end_id_(end_id),
        phase_(starts_in_reasoning ? Phase::kReasoning
               : start_id >= 0     ? Phase::kFirst
                                   : Phase::kAnswer),
        answer_(inner_->start()) {}

  void fill_allowed(std::span<uint64_t> allowed, std::span<const int32_t> eos_ids) override {
    if (phase_ == Phase::kReasoning) {
      std::fill(allowed.begin(), allowed.end(), ~uint64_t{0});
      return;
    }
    answer_->fill_allowed(allowed, eos_ids);
    if (phase_ == Phase::kFirst && start_id_ >= 0 &&
        static_cast<size_t>(start_id_ / 64) < allowed.size())
      allowed[start_id_ / 64] |= uint64_t{1} << (start_id_ % 64);
  }

  bool accept(int32_t token) override {
    switch (phase_) {
      case Phase::kReasoning:
        if (token == end_id_) {
          phase_ = Phase::kAnswer;
          answer_ = inner_->start();
        }
        return true;
      case Phase::kFirst:
        if (token == start_id_) {
          phase_ = Phase::kReasoning;
          return true;
        }
        phase_ = Phase::kAnswer;
        return answer_->accept(token);
      case Phase::kAnswer:
        return answer_->accept(token);
    }
    return false;
  }

  bool must_end() const override { return phase_ == Phase::kAnswer && answer_->must_end(); }

 private:
  std::shared_ptr<const LogitsConstraint> inner_;
  int32_t start_id_, end_id_;
  Phase phase_;
  std::unique_ptr<LogitsConstraintState> answer_;
};

}  // namespace

ReasoningGate::ReasoningGate(std::shared_ptr<const LogitsConstraint> inner, int32_t start_id,
                             int32_t end_id, bool starts_in_reasoning)
    : inner_(std::move(inner)),
      start_id_(start_id),
      end_id_(end_id),
      starts_in_reasoning_(starts_in_reasoning) {}

std::unique_ptr<LogitsConstraintState> ReasoningGate::start() const {
  return std::make_unique<GateState>(inner_, start_id_, end_id_, starts_in_reasoning_);
}

}  // namespace atom::grammar
