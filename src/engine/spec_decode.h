// Speculative decoding (the spec's EagleProposer with the checkpoints' MTP drafters). Each step
// the engine appends a sequence's draft tokens to it provisionally, the target scores the last
// token and every draft in one forward (K + 1 query rows), each row is sampled exactly as it
// would be without speculation (same seed, same output position), and drafts are accepted while
// they equal the target's token; the first mismatch is replaced by the target's token and when
// every draft is accepted the last row's token is a bonus. Rejected rows are rolled back (the
// scheduler counts them as not computed, so their cache slots are rewritten and no block holding
// them is registered in the prefix cache). Then the proposer drafts the next K tokens from the
// target's hidden states of the accepted rows.
//
// Drawing each row with the seeded sampler shared with plain decoding is a coupling of the
// target's and the drafter's choices: with a drafter that proposes one token d, the draft is
// accepted with probability p(d) and on rejection the emitted token is distributed as p without d,
// renormalised, which is rejection sampling's min(1, p/q) acceptance and leftover distribution
// max(p - q, 0) for a one-hot q. The output distribution is the target's exactly; with the same
// seed a request's tokens are the same with and without speculation.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/arena.h"
#include "engine/engine_config.h"
#include "engine/sequence.h"
#include "engine/verify_schedule.h"
#include "layers/batch.h"
#include "layers/context.h"
#include "models/draft_model.h"

namespace atom {

// One sequence the proposer looks at after a target step.
struct DraftRequest {
  Sequence* seq;
  int first_row;  // its rows of the target's batch: [first_row, first_row + num_rows)
  int num_rows;   // at positions [first_pos, first_pos + num_rows), all accepted
  int first_pos;
  int num_drafts;  // draft tokens wanted after them (0: the drafter only fills its cache)
};

class DraftProposer {
 public:
  virtual ~DraftProposer() = default;
  // target_hidden: the target's hidden states of every row of its last batch (undefined when the
  // runner keeps none). drafts[i] receives reqs[i].num_drafts tokens (fewer is allowed). The
  // sequences' block tables hold a slot for every position a draft is written at.
  virtual void propose(const Tensor& target_hidden, std::span<const DraftRequest> reqs,
                       int block_size, std::vector<std::vector<int32_t>>& drafts) = 0;
  // Whether propose's target_hidden is the runner's last_layer_outputs (a block drafter's target
  // layers) instead of its last_hidden.
  virtual bool reads_layer_outputs() const { return false; }
  // The most draft tokens per step it proposes (num_speculative_tokens).
  virtual int max_speculative_tokens() const { return 4; }
  // The target's forward step of `tokens` tokens took `seconds` (a proposer that sizes its
  // proposals by the engine's throughput listens).
  virtual void record_step(int tokens, double seconds) {
    (void)tokens;
    (void)seconds;
  }
};

struct MtpProposerOptions {
  // CUDA: draft steps replay CUDA graphs (engine/decode_graphs.h) when every sequence's accepted
  // run is at most K + 1 rows and all want the same number of drafts, as in steady decoding.
  bool graphs = false;
  int max_model_len = 0;           // with graphs: the longest sequence
  int max_num_seqs = 0;            // with graphs: the largest batch
  int num_speculative_tokens = 0;  // K, with graphs
};

class DecodeGraphs;

// The MTP drafter: draft step 0 over the accepted rows, (token after the row, the target's hidden
// state of the row); steps 1..K-1 one row per sequence, (the last draft, the drafter's own normed
// output). Drafts are the drafter's argmax. Its cache has the target's page count and uses the
// sequences' block tables.
//
// With graphs, step 0 pads each sequence's accepted run to K + 1 rows (the padding rows, after the
// logits row, write no cache slot and are dropped), so one graph per batch size serves every
// acceptance pattern; the steps' draft tokens stay on the device (each step's argmax is the next
// step's input token) and come back to the host in one copy at the end. Otherwise each step runs
// eagerly and its drafts come back before the next is built.
class MtpProposer final : public DraftProposer {
 public:
  MtpProposer(DraftModel& drafter, int num_pages, int block_size, DType kv_dtype,
              const MtpProposerOptions& options = {});
  ~MtpProposer() override;
  void propose(const Tensor& target_hidden, std::span<const DraftRequest> reqs, int block_size,
               std::vector<std::vector<int32_t>>& drafts) override;
  // CUDA graphs captured (0 without graphs), and draft steps run through them so far.
  int num_graphs() const;
  int64_t graph_steps() const;

 private:
  struct Cuda;
  // Forward of `b` at draft step k over `hidden`; returns the argmax of every logits row and
  // keeps the logits rows' hidden states in carry_.
  std::vector<int32_t> run(Batch& b, const Tensor& hidden, int k);
  // The outputs {argmax ids, logits rows' hidden states} of draft step k over the batch, whose
  // rows read input_; in the step's arena.
  std::vector<Tensor> forward_step(Step& step, int k);
  // Every draft step through graphs; false (nothing run) when the requests do not fit them.
  bool propose_graphs(const Tensor& target_hidden, std::span<const DraftRequest> reqs,
                      int block_size, std::vector<std::vector<int32_t>>& drafts);
  DecodeGraphs& graphs_for(int k);

  DraftModel& drafter_;
  MtpProposerOptions options_;
  KvCache kv_;
  Arena arena_;
  Tensor carry_;  // the drafter's output rows the next step consumes (own storage)
  Batch batch_;
  std::unique_ptr<Cuda> cuda_;  // the drafter's stream; null on the CPU
  // With graphs: one set per MTP layer a draft step uses (step 0 also captures K + 1-row
  // batches), the input rows they read, the drafts of every step of a call on the device.
  std::vector<std::unique_ptr<DecodeGraphs>> graphs_;
  Tensor input_;      // [max_num_seqs (K + 1), hidden]
  Tensor draft_ids_;  // [K, max_num_seqs] I32
  std::vector<int32_t> index_host_, ids_host_;
};

// DSpark (models/dspark.h): after each target step the drafter absorbs every sequence's accepted
// rows (the target's layer outputs there, RunnerOptions::layer_outputs) into its context rows,
// then drafts K tokens per sequence in one block pass from the token after them (the anchor), at
// the positions after it. The drafts are its Markov head's argmax. Its cache has the target's
// page count and uses the sequences' block tables (context rows at the target's positions; the
// block itself writes none).
//
// With a confidence schedule (engine/verify_schedule.h) each sequence keeps only the first l_r of
// its drafts, l_r chosen over all the step's blocks from the confidence head and the engine's
// throughput profile.
struct DSparkSchedule {
  bool on = false;
  std::vector<float> temperatures;                // empty or [K]
  std::vector<std::pair<int, double>> sps_table;  // empty: measured
};

class DSparkProposer final : public DraftProposer {
 public:
  using Schedule = DSparkSchedule;
  DSparkProposer(BlockDraftModel& drafter, int num_pages, int block_size, DType kv_dtype,
                 int num_speculative_tokens, Schedule schedule = {});
  void propose(const Tensor& layer_outputs, std::span<const DraftRequest> reqs, int block_size,
               std::vector<std::vector<int32_t>>& drafts) override;
  bool reads_layer_outputs() const override { return true; }
  int max_speculative_tokens() const override { return kMaxTokens; }
  void record_step(int tokens, double seconds) override { profile_.record(tokens, seconds); }
  const ThroughputProfile& profile() const { return profile_; }
  // With a schedule: the drafts the blocks proposed and those the schedule kept, so far.
  int64_t drafted() const { return drafted_; }
  int64_t kept() const { return kept_; }
  static constexpr int kMaxTokens = 8;

 private:
  BlockDraftModel& drafter_;
  int K_;
  Schedule schedule_;
  ThroughputProfile profile_;
  int64_t drafted_ = 0, kept_ = 0;
  KvCache kv_;
  Arena arena_;
  Batch batch_;
};

// "mean acceptance length 1.83, accepted 0.71 0.52 0.40 per position, 120 drafts, 360 draft
// tokens, 197 accepted": the acceptance length counts the target's own token (1 + accepted per
// verification), per position the share of verifications whose draft there was accepted.
std::string spec_decode_stats_line(int64_t num_drafts, int64_t num_draft_tokens,
                                   int64_t num_accepted, const std::vector<int64_t>& per_position);

// --speculative-config, vLLM's JSON: {"method": "mtp", "num_speculative_tokens": K}, K in 1..4,
// or {"method": "dspark", ...}, K in 1..DSparkProposer::kMaxTokens.
// Sets config.speculative_method and config.num_speculative_tokens; an Error naming the key and
// the accepted values otherwise.
void speculative_config_parse(const std::string& json, EngineConfig& config);

}  // namespace atom
