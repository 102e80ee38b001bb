#include "engine/llm_engine.h"

#include <algorithm>

#include "core/error.h"
#include "core/parallel.h"
#include "core/log.h"
#include "engine/tp_runner.h"
#include "kernels/rng.h"
#include "models/moonvit.h"

namespace atom {

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The runner for this plan: one device's, or every tensor-parallel rank's. On CUDA without
// --num-gpu-blocks-override it sizes the KV cache from free GPU memory; the plan takes its page
// count.
std::unique_ptr<StepRunner> runner_create(Model& model, ModelGroup* models, const EngineConfig& c,
                                          KvCachePlan& plan, const DraftModel* drafter) {
  RunnerOptions o;
  o.block_size = plan.block_size;
  o.num_pages = plan.num_blocks;  // 0: measured
  o.max_model_len = plan.max_model_len;
  o.max_num_seqs = c.max_num_seqs;
  o.max_num_batched_tokens = c.max_num_batched_tokens;
  o.gpu_memory_utilization = c.gpu_memory_utilization;
  // Speculative decoding's verification steps (K + 1 query rows per sequence) get decode graphs
  // of their own; the runner keeps their hidden states for the drafter.
  o.enforce_eager = c.enforce_eager;
  o.num_speculative_tokens = c.num_speculative_tokens;
  o.num_state_slots = plan.num_state_slots;
  o.kv_cache_dtype = plan.kv_cache_dtype;
  // A block drafter (DSpark) drafts from some target layers' outputs, which the runner keeps.
  if (c.speculative_method == "dspark" && drafter && drafter->method() == "dspark")
    o.layer_outputs = drafter->target_layer_outputs();
  std::unique_ptr<StepRunner> runner =
      models ? step_runner_create(*models, o) : std::make_unique<ModelRunner>(model, o);
  plan.num_blocks = runner->num_pages();
  return runner;
}

std::string kv_source(const EngineConfig& c, const KvCachePlan& p) {
  if (c.num_gpu_blocks_override > 0) return "--num-gpu-blocks-override";
  if (p.from_gpu_memory)
    return fmt::format("free GPU memory at gpu_memory_utilization {}", c.gpu_memory_utilization);
  return fmt::format("--kv-cache-memory {} bytes",
                     c.kv_cache_memory > 0 ? c.kv_cache_memory : kCpuKvCacheMemory);
}
}  // namespace

LLMEngine::LLMEngine(Model& model, const EngineConfig& config, const GenerationConfig& generation,
                     TextStreamFactory text, DraftModel* drafter)
    : LLMEngine(model, nullptr, config, generation, std::move(text), drafter) {}

LLMEngine::LLMEngine(ModelGroup& models, const EngineConfig& config,
                     const GenerationConfig& generation, TextStreamFactory text,
                     DraftModel* drafter)
    : LLMEngine(models.model(), &models, config, generation, std::move(text), drafter) {}

LLMEngine::LLMEngine(Model& model, ModelGroup* models, const EngineConfig& config,
                     const GenerationConfig& generation, TextStreamFactory text,
                     DraftModel* drafter)
    : model_(model),
      config_(config),
      plan_(kv_cache_plan(model, config, models)),
      defaults_(sampling_params_defaults(generation)),
      text_(std::move(text)),
      ranks_(models ? models->world_size() : 1),
      pp_size_(models ? models->pp_size() : 1),
      runner_(runner_create(model, models, config, plan_, drafter)),
      // Recurrent state summarises a whole prefix, so KV blocks alone cannot resume one: prefix
      // caching needs state checkpoints (--state-checkpoint-interval-tokens).
      blocks_(plan_.num_blocks, plan_.block_size,
              config.enable_prefix_caching &&
                  (plan_.state_slots_per_request == 0 || plan_.num_checkpoint_slots > 0),
              block_hash_xxh64, runner_->page_partitions()),
      states_(plan_.num_state_slots - plan_.num_checkpoint_slots, plan_.state_slots_per_request),
      scheduler_(SchedulerConfig{config.max_num_seqs, config.max_num_batched_tokens,
                                 config.long_prefill_token_threshold,
                                 config.state_checkpoint_interval_tokens,
                                 plan_.num_state_slots - plan_.num_checkpoint_slots,
                                 plan_.num_checkpoint_slots},
                 blocks_, states_),
      sampler_(std::make_unique<CpuSampler>()),
      seed_rng_(config.seed) {
  for (int64_t e : generation.eos_token_ids)
    if (e >= 0 && e < model.vocab_size()) eos_ids_.push_back(static_cast<int32_t>(e));
  if (config.enable_prefix_caching && !blocks_.prefix_caching())
    log_info("prefix caching is off: the model keeps recurrent state "
             "(--state-checkpoint-interval-tokens turns it on)");
  const bool graphs = !runner_->graph_buckets().empty();
  if (graphs) {
    // Up front, as vLLM does: captured on first use, the buckets a shrinking batch walks through
    // would each stall a step of the run.
    const auto t0 = Clock::now();
    runner_->capture_decode_graphs();
    log_info("captured {} decode CUDA graphs (batch sizes 1 to {}) in {:.2f} s",
             runner_->graph_buckets().size(), runner_->graph_buckets().back(),
             seconds(Clock::now() - t0));
  }
  // With tensor parallelism every rank holds this many blocks of its own kv heads.
  const std::string where =
      ranks_ == 1
          ? model.device().str()
          : fmt::format("{} ranks from {} ({}{}, KV per rank)", ranks_, model.device().str(),
                        runner_->page_partitions() > 1
                            ? fmt::format("data-parallel attention, each rank {} of the blocks",
                                          plan_.num_blocks / runner_->page_partitions())
                        : pp_size_ == 1 ? std::string("tensor parallel")
                                        : fmt::format("{} pipeline stages of {} "
                                                      "tensor-parallel ranks",
                                                      pp_size_, ranks_ / pp_size_),
                        !model.expert_parallel() ? ""
                        : model.eplb_step_interval() > 0
                            ? fmt::format(", experts split over the ranks "
                                          "with EPLB every {} steps",
                                          model.eplb_step_interval())
                            : ", experts split over the ranks");
  log_info(
      "engine on {}: {} KV blocks of {} tokens ({:.1f} MiB of {}, {} tokens, from {}), {} state "
      "slots "
      "({:.1f} MiB), max_model_len {}, max_num_seqs {}, max_num_batched_tokens {}, prefix "
      "caching {}, decode {}",
      where, plan_.num_blocks, plan_.block_size,
      static_cast<double>(plan_.block_bytes) * plan_.num_blocks / (1 << 20),
      dtype_name(plan_.kv_cache_dtype), static_cast<int64_t>(plan_.num_blocks) * plan_.block_size,
      kv_source(config, plan_), plan_.num_state_slots,
      static_cast<double>(plan_.state_slot_bytes) * plan_.num_state_slots / (1 << 20),
      plan_.max_model_len, config.max_num_seqs, config.max_num_batched_tokens,
      blocks_.prefix_caching() ? "on" : "off", graphs ? "from CUDA graphs" : "eager");
  if (config.speculative_method == "dspark") {
    const std::string& arch = model.config().architectures.at(0);
    if (!drafter)
      fail("speculative decoding with method 'dspark' needs the target's drafter (drafter_load)");
    auto* block = dynamic_cast<BlockDraftModel*>(drafter);
    if (!block || drafter->method() != "dspark")
      fail("speculative decoding with method 'dspark' needs DSpark stages in the checkpoint "
           "(dspark_* in its config); {}'s drafter is '{}'",
           arch, drafter->method());
    if (ranks_ > 1)
      fail("speculative decoding with method 'dspark' runs on one rank so far, not {}", ranks_);
    if (drafter->device() != model.device())
      fail("the drafter is on {} but the target on {}", drafter->device().str(),
           model.device().str());
    DSparkProposer::Schedule schedule;
    schedule.on = config.spec_confidence_schedule;
    schedule.temperatures = config.spec_sts_temperatures;
    schedule.sps_table = config.spec_sps_table;
    set_proposer(std::make_unique<DSparkProposer>(
        *block, plan_.num_blocks, plan_.block_size, plan_.kv_cache_dtype,
        config.num_speculative_tokens, std::move(schedule)));
    std::string layers;
    for (int64_t l : drafter->target_layer_outputs())
      layers += (layers.empty() ? "" : ", ") + std::to_string(l);
    log_info("speculative decoding: method dspark, {} draft tokens per step in one block pass, {} "
             "DSpark stage(s) reading target layers [{}], {}",
             config.num_speculative_tokens, drafter->num_draft_layers(), layers,
             !config.spec_confidence_schedule ? std::string("every draft verified")
             : config.spec_sps_table.empty()
                 ? std::string("verify lengths from the confidence head and the measured "
                               "throughput")
                 : fmt::format("verify lengths from the confidence head and a given throughput "
                               "profile of {} points",
                               config.spec_sps_table.size()));
  } else if (config.spec_confidence_schedule) {
    fail("a confidence schedule needs speculative decoding with method 'dspark', not '{}'",
         config.speculative_method);
  } else if (!config.speculative_method.empty()) {
    if (config.speculative_method != "mtp")
      fail("speculative decoding method '{}' is not supported (supported: mtp, dspark)",
           config.speculative_method);
    if (!drafter)
      fail("speculative decoding with method 'mtp' needs the target's drafter (drafter_load)");
    if (drafter->method() != "mtp")
      fail("speculative decoding with method 'mtp': {}'s drafter is '{}' (its mtp.* stages are a "
           "block drafter): use method '{}'",
           model.config().architectures.at(0), drafter->method(), drafter->method());
    // Under parallelism the drafter reads the leader's hidden states (rank 0 of the last stage).
    const Device lead = models ? models->model(models->leader()).device() : model.device();
    if (drafter->device() != lead)
      fail("the drafter is on {} but the target's leader on {}", drafter->device().str(),
           lead.str());
    MtpProposerOptions po;
    po.graphs = graphs;
    po.max_model_len = plan_.max_model_len;
    po.max_num_seqs = config.max_num_seqs;
    po.num_speculative_tokens = config.num_speculative_tokens;
    const auto t0 = Clock::now();
    auto proposer = std::make_unique<MtpProposer>(*drafter, plan_.num_blocks, plan_.block_size,
                                                  plan_.kv_cache_dtype, po);
    if (proposer->num_graphs() > 0)
      log_info("captured {} drafter CUDA graphs in {:.2f} s", proposer->num_graphs(),
               seconds(Clock::now() - t0));
    set_proposer(std::move(proposer));
    log_info("speculative decoding: method mtp, {} draft tokens per step, {} MTP layer(s){}",
             config.num_speculative_tokens, drafter->num_draft_layers(),
             config.spec_decode_acceptance_rate >= 0
                 ? fmt::format(", draft tokens accepted with probability {} (benchmarking: "
                               "outputs are not the model's)",
                               config.spec_decode_acceptance_rate)
                 : std::string());
  } else if (config.spec_decode_acceptance_rate >= 0) {
    fail("--spec-decode-acceptance-rate needs speculative decoding (--speculative-config)");
  }
}

void LLMEngine::set_proposer(std::unique_ptr<DraftProposer> proposer) {
  const int K = config_.num_speculative_tokens;
  if (K < 1 || K > proposer->max_speculative_tokens())
    fail("speculative decoding: num_speculative_tokens must be in 1..{}, got {}",
         proposer->max_speculative_tokens(), K);
  if (!requests_.empty()) fail("speculative decoding must be set up before requests are added");
  // Rejected draft tokens roll back recurrent state through the state pool's rollback slots,
  // which every recurrent layer must fill (StateCacheSpec::rollback_rows).
  for (const StateCacheSpec& s : model_.state_specs())
    if (!s.rollback_rows)
      fail("speculative decoding is not supported for {}: its recurrent layers keep no state per "
           "row to roll rejected draft tokens back to",
           model_.config().architectures.at(0));
  if (plan_.state_slots_per_request > 0 && plan_.state_slots_per_request < 1 + K)
    fail("speculative decoding with {} draft tokens needs {} state slots per request, the plan "
         "has {}",
         K, 1 + K, plan_.state_slots_per_request);
  const double r = config_.spec_decode_acceptance_rate;
  if (r >= 0 && r > 1) fail("--spec-decode-acceptance-rate must be in [0, 1], got {}", r);
  proposer_ = std::move(proposer);
  stats_.spec_accepted_per_position.assign(static_cast<size_t>(K), 0);
}

bool LLMEngine::spec_eligible(const Sequence& seq) const {
  // Structured output and logprobs follow one token at a time (a grammar state, one logprob per
  // token): such requests decode without drafts.
  const SamplingParams& p = seq.params();
  return proposer_ && !seq.constraint && !p.logprobs;
}

void LLMEngine::spec_append_drafts() {
  for (auto& [id, req] : requests_)
    for (auto& s : req->seqs) {
      Sequence& seq = *s;
      if (seq.spec_drafts.empty()) continue;
      if (seq.status == SeqStatus::kRunning && seq.num_tokens() - seq.num_computed_tokens == 1) {
        seq.tokens.insert(seq.tokens.end(), seq.spec_drafts.begin(), seq.spec_drafts.end());
        seq.num_draft_tokens = static_cast<int>(seq.spec_drafts.size());
      }
      seq.spec_drafts.clear();
    }
}

void LLMEngine::spec_trim_drafts(const SchedulerOutput& so) {
  std::unordered_map<const Sequence*, int> scheduled;
  for (const ScheduledSeq& s : so.seqs) scheduled.emplace(s.seq, s.num_new_tokens);
  for (auto& [id, req] : requests_)
    for (auto& s : req->seqs) {
      Sequence& seq = *s;
      const int d = seq.num_draft_tokens;
      if (d == 0) continue;
      // Verified are the drafts the step reaches (a token budget may cut it short); the others,
      // and all of a sequence that was not scheduled or was preempted, are dropped.
      auto it = scheduled.find(&seq);
      const int keep = it == scheduled.end() ? 0 : std::min(d, it->second - 1);
      seq.tokens.resize(seq.tokens.size() - static_cast<size_t>(d - keep));
      seq.num_draft_tokens = keep;
    }
}

// After sampling, before step_done: how many drafts each verified sequence accepts.
void LLMEngine::spec_verify() {
  spec_groups_.clear();
  const double rate = config_.spec_decode_acceptance_rate;
  for (size_t i = 0; i < task_seqs_.size();) {
    Sequence& seq = *task_seqs_[i];
    const int d = seq.num_draft_tokens;
    if (d == 0) {
      ++i;
      continue;
    }
    SpecGroup g{i, d, {}, 0};
    const size_t first_draft = seq.tokens.size() - static_cast<size_t>(d);
    const int n_out = seq.num_output_tokens();
    int accepted = 0;
    for (int j = 0; j <= d; ++j) {
      const int32_t src = task_source_[i + static_cast<size_t>(j)];
      const int32_t t = src >= 0 ? samples_.tokens[static_cast<size_t>(src)]
                                 : host_sampled_[static_cast<size_t>(-1 - src)];
      if (j == d) {  // every draft accepted: the last row's token is a bonus
        g.emit.push_back(t);
        break;
      }
      const int32_t draft = seq.tokens[first_draft + static_cast<size_t>(j)];
      bool accept = draft == t;
      if (!accept && rate >= 0) {
        // Benchmarking: accepted with probability `rate`, keyed by the sequence and position.
        const uint64_t h = kernels::random_mix(
            seq.seed ^ kernels::random_mix(static_cast<uint64_t>(n_out + j) ^ 0x5370656344656eull));
        accept = static_cast<double>(h >> 11) * 0x1.0p-53 < rate;
      }
      if (!accept) {
        g.emit.push_back(t);  // the target's token replaces the first rejected draft
        break;
      }
      g.emit.push_back(draft);
      ++accepted;
      ++stats_.spec_accepted_per_position[static_cast<size_t>(j)];
    }
    ++stats_.spec_num_drafts;
    stats_.spec_num_draft_tokens += d;
    stats_.spec_num_accepted_tokens += accepted;
    // Rejected rows were computed but are not part of the sequence: rolled back.
    // The accepted drafts stay until the run is appended, so that step_done finds the tokens it
    // counts as computed (and hashes them into full blocks).
    if (d - accepted > 0) scheduler_.reject_tail(&seq, d - accepted);
    // Recurrent state: the state after the last accepted row becomes the committed one.
    if (!seq.state_slots.empty()) StatePool::commit_rows(seq, d + 1, accepted + 1);
    seq.tokens.resize(first_draft + static_cast<size_t>(accepted));
    seq.num_draft_tokens = 0;
    g.num_tokens_before = first_draft;
    spec_groups_.push_back(std::move(g));
    i += static_cast<size_t>(d) + 1;
  }
}

// After the step's tokens are appended: the drafter reads the target's hidden states of every
// accepted row and proposes the next drafts of each sequence that decodes next.
void LLMEngine::spec_propose(const SchedulerOutput& so) {
  spec_reqs_.clear();
  const int K = config_.num_speculative_tokens;
  for (size_t i = 0; i < so.seqs.size(); ++i) {
    Sequence& seq = *so.seqs[i].seq;
    if (seq.finished() || !spec_eligible(seq)) continue;
    const int first_row = batch_.query_start[i];
    const int first_pos = batch_.positions[static_cast<size_t>(first_row)];
    const int num_rows = seq.num_computed_tokens - first_pos;  // accepted rows of this step
    int want = 0;
    if (seq.num_tokens() - seq.num_computed_tokens == 1) {
      // Never past max_model_len or max_tokens (the bonus token is one more).
      want = std::min({K, plan_.max_model_len - seq.num_tokens(),
                       seq.params().max_tokens - seq.num_output_tokens() - 1});
      want = std::max(want, 0);
      // Draft step k >= 1 writes the drafter's cache at position num_computed - 1 + k.
      if (want > 1 && !blocks_.append_slots(seq, want - 1)) want = 1;
    }
    spec_reqs_.push_back({&seq, first_row, num_rows, first_pos, want});
  }
  if (spec_reqs_.empty()) return;
  proposer_->propose(
      proposer_->reads_layer_outputs() ? runner_->last_layer_outputs() : runner_->last_hidden(),
      spec_reqs_, plan_.block_size, spec_drafts_);
  for (size_t i = 0; i < spec_reqs_.size(); ++i) {
    auto& d = spec_drafts_[i];
    if (static_cast<int>(d.size()) > spec_reqs_[i].num_drafts)
      d.resize(static_cast<size_t>(spec_reqs_[i].num_drafts));
    spec_reqs_[i].seq->spec_drafts = std::move(d);
  }
}

LLMEngine::~LLMEngine() = default;

VisionEncoder& LLMEngine::images_encoder() const {
  VisionEncoder* encoder = model_.vision_encoder();
  if (!encoder)
    fail("this model ({}) takes no images", model_.config().architectures.empty()
                                                ? model_.config().model_type
                                                : model_.config().architectures[0]);
  if (proposer_) fail("images with speculative decoding are not implemented");
  return *encoder;
}

void LLMEngine::add_request(const std::string& request_id, std::vector<int32_t> prompt,
                            const SamplingParams& params, const std::vector<PromptImage>& images) {
  if (images.empty()) {
    add_request(request_id, std::move(prompt), params, std::shared_ptr<const RequestImages>());
    return;
  }
  if (requests_.count(request_id)) fail("request id '{}' is already in use", request_id);
  VisionEncoder& encoder = images_encoder();
  // The expanded length is checked before the tower runs.
  int64_t expanded = static_cast<int64_t>(prompt.size()) - static_cast<int64_t>(images.size());
  for (const PromptImage& im : images) expanded += encoder.tokens_for(im.grid);
  if (expanded > plan_.max_model_len)
    fail("The decoder prompt (length {} with its images' tokens) is longer than the maximum "
         "model length of {}.",
         expanded, plan_.max_model_len);
  if (expanded > config_.max_num_batched_tokens)
    fail("a prompt with images is prefilled in one step and its {} tokens exceed "
         "max_num_batched_tokens ({})",
         expanded, config_.max_num_batched_tokens);
  std::shared_ptr<const RequestImages> mm = prompt_images_expand(encoder, prompt, images);
  add_request(request_id, std::move(prompt), params, std::move(mm));
}

void LLMEngine::add_request(const std::string& request_id, std::vector<int32_t> prompt,
                            const SamplingParams& params, std::shared_ptr<const RequestImages> mm) {
  if (requests_.count(request_id)) fail("request id '{}' is already in use", request_id);
  params.validate(model_.vocab_size());
  if (prompt.empty()) fail("the prompt is empty: at least one token is needed");
  for (int32_t t : prompt)
    if (t < 0 || t >= model_.vocab_size())
      fail("prompt token id {} is outside the vocabulary [0, {})", t, model_.vocab_size());
  if (mm) {
    const VisionEncoder& encoder = images_encoder();
    prompt_images_check(*mm, prompt, encoder.image_token_id(), model_.config().hidden_size);
    if (static_cast<int64_t>(prompt.size()) > config_.max_num_batched_tokens)
      fail("a prompt with images is prefilled in one step and its {} tokens exceed "
           "max_num_batched_tokens ({})",
           prompt.size(), config_.max_num_batched_tokens);
  }
  const int P = static_cast<int>(prompt.size());
  if (P > plan_.max_model_len)
    fail("The decoder prompt (length {}) is longer than the maximum model length of {}.", P,
         plan_.max_model_len);
  if (!params.stop.empty() && !text_)
    fail("stop strings need a detokenizer and this engine has none; use stop_token_ids");

  auto req = std::make_unique<Request>();
  req->id = request_id;
  req->params = params;
  req->images = std::move(mm);
  req->arrival = Clock::now();
  if (params.min_tokens > 0) {
    req->min_tokens_suppressed = params.stop_token_ids;
    if (!params.ignore_eos)
      req->min_tokens_suppressed.insert(req->min_tokens_suppressed.end(), eos_ids_.begin(),
                                        eos_ids_.end());
  }
  if (params.prompt_logprobs) req->prompt_logprobs.resize(static_cast<size_t>(P));
  const uint64_t seed = params.seed ? static_cast<uint64_t>(*params.seed) : seed_rng_();
  // Every token a sequence can hold is reserved now, so decoding appends without reallocating.
  const size_t capacity = static_cast<size_t>(
      std::min<int64_t>(int64_t{P} + params.max_tokens, plan_.max_model_len + 1));
  for (int i = 0; i < params.n; ++i) {
    auto seq = std::make_unique<Sequence>();
    seq->request = req.get();
    seq->index = i;
    seq->seed = seed + static_cast<uint64_t>(i);  // vLLM: sample i of n uses seed + i
    seq->tokens.reserve(capacity);
    seq->tokens = prompt;
    seq->num_prompt_tokens = P;
    seq->token_times.reserve(capacity - static_cast<size_t>(P));
    if (params.logprobs) seq->logprobs.reserve(capacity - static_cast<size_t>(P));
    if (text_) seq->text_stream = text_(prompt, params.skip_special_tokens);
    if (params.constraint) seq->constraint = params.constraint->start();
    if (i > 0 && blocks_.prefix_caching()) seq->prefix_leader = req->seqs[0].get();
    seq->collects_prompt_logprobs = i == 0 && params.prompt_logprobs && P > 1;
    req->seqs.push_back(std::move(seq));
  }
  req->prompt = std::move(prompt);
  Request* r = req.get();
  requests_.emplace(request_id, std::move(req));
  for (auto& seq : r->seqs) {
    if (params.max_tokens == 0 && !seq->collects_prompt_logprobs) {
      seq->status = SeqStatus::kFinished;  // never queued: nothing to compute
      finish_sequence(*seq, FinishReason::kLength);
      continue;
    }
    scheduler_.add(seq.get());
  }
}

void LLMEngine::finish_sequence(Sequence& seq, FinishReason reason) {
  if (seq.finish_reason != FinishReason::kNone) return;
  seq.finish_reason = reason;
  scheduler_.finish(&seq);
  Request& req = *seq.request;
  ++req.num_finished;
  if (req.finished()) {
    auto node = requests_.extract(req.id);
    if (!node.empty()) done_.push_back(std::move(node.mapped()));
  }
}

void LLMEngine::append_token(Sequence& seq, int32_t token, Clock::time_point now, StepOutput& out,
                             bool end_after) {
  const SamplingParams& p = seq.params();
  seq.tokens.push_back(token);
  seq.token_times.push_back(now);
  const int n_out = seq.num_output_tokens();
  // vLLM's check order: length first, then (past min_tokens) EOS and stop ids, then stop strings.
  FinishReason finish = FinishReason::kNone;
  bool stopped_by_token = false;
  if (seq.num_tokens() >= plan_.max_model_len || n_out >= p.max_tokens) {
    finish = FinishReason::kLength;
  } else if (n_out >= p.min_tokens) {
    if (!p.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) {
      finish = FinishReason::kStop;
      stopped_by_token = true;
    } else if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
               p.stop_token_ids.end()) {
      finish = FinishReason::kStop;
      stopped_by_token = true;
      seq.stop_reason = token;
    }
  }
  // A complete structured output ends with this token (its text kept), as at EOS.
  if (finish == FinishReason::kNone && end_after) finish = FinishReason::kStop;
  std::string piece;
  if (seq.text_stream) {
    // The text of the token that stopped generation is left out unless asked for.
    if (!stopped_by_token || p.include_stop_str_in_output) piece = seq.text_stream->append(token);
    if (finish != FinishReason::kNone) piece += seq.text_stream->finish();
    const size_t before = seq.text.size();
    seq.text += piece;
    if (!p.stop.empty() && n_out >= p.min_tokens && !stopped_by_token) {
      if (auto m = stop_string_find(seq.text, before, p.stop)) {
        const std::string& s = p.stop[m->stop_index];
        seq.text.resize(m->pos + (p.include_stop_str_in_output ? s.size() : 0));
        finish = FinishReason::kStop;
        seq.stop_reason = s;
      }
    }
    // A stop string may begin in text already produced (inside an earlier token), and streamed
    // text cannot be taken back: as vLLM, hold back the last (longest stop string - 1) bytes
    // until the sequence ends or they can no longer start a match.
    size_t emit_to = seq.text.size();
    if (finish == FinishReason::kNone && !p.stop.empty()) {
      size_t longest = 0;
      for (const auto& s : p.stop) longest = std::max(longest, s.size());
      emit_to = seq.text.size() + 1 > longest ? seq.text.size() + 1 - longest : 0;
      // Never split a UTF-8 character.
      while (emit_to > seq.text_emitted && emit_to < seq.text.size() &&
             (static_cast<unsigned char>(seq.text[emit_to]) & 0xC0) == 0x80)
        --emit_to;
    }
    ATOM_CHECK(seq.text.size() >= seq.text_emitted, "stop truncation took back streamed text");
    emit_to = std::max(emit_to, seq.text_emitted);
    piece = seq.text.substr(seq.text_emitted, emit_to - seq.text_emitted);
    seq.text_emitted = emit_to;
  }
  out.tokens.push_back(
      {&seq.request->id, &seq, seq.index, token, std::move(piece), finish != FinishReason::kNone});
  ++stats_.generation_tokens;
  if (finish != FinishReason::kNone) finish_sequence(seq, finish);
}

void LLMEngine::plan_sampling() {
  sampling_.clear();
  tasks_.clear();
  constrained_.clear();
  masks_ready_ = {};
  task_seqs_.clear();
  task_source_.clear();
  prompt_rows_.clear();
  for (size_t r = 0; r < rows_.size(); ++r) {
    Sequence& seq = *rows_[r].seq;
    Request& req = *seq.request;
    const SamplingParams& p = req.params;
    const auto row = static_cast<int32_t>(r);
    const auto host_row = static_cast<int32_t>(sampling_.host_rows.size());
    if (rows_[r].prompt_pos >= 0) {
      prompt_rows_.push_back({&seq, rows_[r].prompt_pos, host_row});
      sampling_.host_rows.push_back(row);
      continue;
    }
    // A verify row draws the token after draft draft_index - 1: output position n_out + index.
    const int n_out = seq.num_output_tokens() + std::max(0, rows_[r].draft_index);
    // Decided by the request's own parameters and output count, never by its neighbours; and
    // both paths draw the same token from the same row anyway (sampler.h).
    const bool suppressing = n_out < p.min_tokens && !req.min_tokens_suppressed.empty();
    task_seqs_.push_back(&seq);
    const size_t task = task_seqs_.size() - 1;
    if (device_sampleable(p) && !suppressing) {
      // A constrained row is drawn on the device too, under its mask (StepSampling::device_mask).
      if (seq.constraint) {
        sampling_.device_mask.resize(sampling_.device_rows.size(), -1);
        sampling_.device_mask.push_back(static_cast<int32_t>(constrained_.size()));
        constrained_.push_back({task, -1, &seq});
      }
      task_source_.push_back(static_cast<int32_t>(sampling_.device_rows.size()));
      sampling_.device_rows.push_back(row);
      sampling_.device_params.push_back(sampling_row(p, seq.seed, n_out));
      continue;
    }
    SampleTask t;
    t.row = host_row;
    t.params = &p;
    t.seed = seq.seed;
    t.position = n_out;
    t.prompt =
        std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(seq.num_prompt_tokens));
    t.output = std::span<const int32_t>(seq.tokens.data() + seq.num_prompt_tokens,
                                        static_cast<size_t>(n_out));
    if (suppressing) t.suppressed = req.min_tokens_suppressed;
    if (p.logprobs) t.logprob = &seq.logprobs.emplace_back();
    if (seq.constraint) constrained_.push_back({task, static_cast<int32_t>(tasks_.size()), &seq});
    task_source_.push_back(-1 - static_cast<int32_t>(tasks_.size()));
    sampling_.host_rows.push_back(row);
    tasks_.push_back(t);
  }
  if (sampling_.device_mask.size() < sampling_.device_rows.size() && !sampling_.device_mask.empty())
    sampling_.device_mask.resize(sampling_.device_rows.size(), -1);
  // Structured output: each constrained row's allowed tokens, computed on a worker thread while
  // the forward runs. The runner waits for them before it draws the device rows; step() before
  // it draws the host rows.
  if (!constrained_.empty()) {
    const size_t words = static_cast<size_t>((model_.vocab_size() + 63) / 64);
    mask_words_ = words;
    masks_.assign(constrained_.size() * words, 0);
    for (size_t k = 0; k < constrained_.size(); ++k)
      if (constrained_[k].host_task >= 0)
        tasks_[static_cast<size_t>(constrained_[k].host_task)].allowed =
            std::span<const uint64_t>(masks_.data() + k * words, words);
    // Rows are independent (each has its own matcher; a constraint's mask cache is locked), so
    // a batch of them fans out over threads: one row of a 151k-token vocabulary takes 0.1-0.2 ms
    // on one core, which 64 rows in a row would add to every step of a fast GPU.
    masks_ready_ =
        std::async(std::launch::async, [this] {
          const auto n = static_cast<int64_t>(constrained_.size());
          ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (n >= 4)
          for (int64_t k = 0; k < n; ++k) {
            errors.guard([&] {
              const Sequence& seq = *constrained_[static_cast<size_t>(k)].seq;
              const bool eos_ok = !seq.params().ignore_eos;
              seq.constraint->fill_allowed(
                  std::span<uint64_t>(masks_.data() + static_cast<size_t>(k) * mask_words_,
                                      mask_words_),
                  eos_ok ? std::span<const int32_t>(eos_ids_) : std::span<const int32_t>());
            });
          }
          errors.rethrow();
        }).share();
    if (!sampling_.device_mask.empty()) {
      sampling_.mask_words = static_cast<int64_t>(words);
      sampling_.masks = [this, ready = masks_ready_]() {
        ready.get();
        return std::span<const uint64_t>(masks_);
      };
    }
  }
}

void LLMEngine::check_progress(const SchedulerOutput& so) {
  // Capacity is checked at start-up (one max_model_len sequence always fits), so an idle step with
  // work queued is a bug, not a state to wait out.
  ATOM_CHECK(!so.empty(),
             "scheduler made no progress: {} waiting, {} running, {} of {} blocks free",
             scheduler_.num_waiting(), scheduler_.num_running(), blocks_.num_free_blocks(),
             blocks_.num_blocks());
}

StepOutput LLMEngine::step() {
  StepOutput out;
  returned_.clear();  // outputs handed back last step no longer need their requests
  if (scheduler_.has_unfinished()) {
    const Clock::time_point step_start = Clock::now();
    if (proposer_) spec_append_drafts();
    const SchedulerOutput& so = scheduler_.schedule();
    check_progress(so);
    if (proposer_) spec_trim_drafts(so);
    if (on_scheduled_) on_scheduled_(scheduler_.num_running(), scheduler_.num_waiting());
    out.num_scheduled_tokens = so.num_tokens;
    out.tokens.reserve(so.seqs.size());
    batch_build(so, plan_.block_size, batch_, rows_);
    plan_sampling();
    const Clock::time_point forward_start = Clock::now();
    runner_->execute_sampling(batch_, sampling_, samples_);
    const double forward = seconds(Clock::now() - forward_start);
    stats_.forward_seconds += forward;
    if (proposer_) proposer_->record_step(batch_.num_tokens(), forward);
    const Tensor& host = samples_.host_logits;
    const int64_t V = model_.vocab_size();
    for (const PromptRow& pr : prompt_rows_) {
      Request& req = *pr.seq->request;
      auto& slot = req.prompt_logprobs[static_cast<size_t>(pr.prompt_pos + 1)];
      slot.emplace();
      logprobs_compute(host.ptr<float>() + static_cast<int64_t>(pr.host_row) * V, V,
                       req.prompt[static_cast<size_t>(pr.prompt_pos + 1)],
                       *req.params.prompt_logprobs, *slot, lp_scratch_);
    }
    host_sampled_.resize(tasks_.size());
    if (masks_ready_.valid()) masks_ready_.get();
    // A constrained row that allows nothing (the grammar cannot go on and no end of sequence is
    // allowed) ends here instead of drawing (a device row's draw is dropped).
    blocked_.assign(task_seqs_.size(), 0);
    for (size_t k = 0; k < constrained_.size(); ++k) {
      const uint64_t* m = masks_.data() + k * mask_words_;
      if (std::all_of(m, m + mask_words_, [](uint64_t w) { return w == 0; })) {
        blocked_[constrained_[k].task] = 1;
        if (constrained_[k].host_task >= 0)
          tasks_[static_cast<size_t>(constrained_[k].host_task)].allowed = {};
      }
    }
    if (!tasks_.empty()) sampler_->sample(host, tasks_, host_sampled_);

    for (const ScheduledSeq& s : so.seqs) {
      Sequence& seq = *s.seq;
      const int end = seq.num_computed_tokens + s.num_new_tokens;
      stats_.prompt_tokens +=
          std::max(0, std::min(end, seq.num_prompt_tokens) - seq.num_computed_tokens);
      if (seq.collects_prompt_logprobs) {
        Request& req = *seq.request;
        req.prompt_logprobs_done =
            std::max(req.prompt_logprobs_done, std::min(end + 1, seq.num_prompt_tokens));
        if (req.prompt_logprobs_done >= seq.num_prompt_tokens) seq.collects_prompt_logprobs = false;
      }
    }
    if (proposer_) spec_verify();
    scheduler_.step_done();
    const Clock::time_point now = Clock::now();
    size_t group = 0;
    for (size_t i = 0; i < task_seqs_.size(); ++i) {
      const int32_t src = task_source_[i];
      Sequence& seq = *task_seqs_[i];
      if (group < spec_groups_.size() && spec_groups_[group].first_task == i) {
        // A verified run: its tokens in order, up to the one that ends the request (EOS, a stop
        // id or string, max_tokens), which drops the rest.
        const SpecGroup& g = spec_groups_[group++];
        seq.tokens.resize(g.num_tokens_before);
        for (int32_t token : g.emit) {
          if (seq.finished()) break;
          append_token(seq, token, now, out);
        }
        i += static_cast<size_t>(g.num_drafts);
        continue;
      }
      const int32_t token = src >= 0 ? samples_.tokens[src] : host_sampled_[-1 - src];
      if (seq.constraint) {
        if (blocked_[i] || !seq.constraint->accept(token)) {
          finish_sequence(seq, FinishReason::kStop);
          continue;
        }
      }
      // A grammar that is complete and allows nothing more ends the output with this token.
      append_token(seq, token, now, out, seq.constraint && seq.constraint->must_end());
    }
    if (proposer_) {
      spec_propose(so);
      const Clock::time_point t = Clock::now();
      if (t - spec_logged_at_ > std::chrono::seconds(10) && stats_.spec_num_drafts > 0) {
        if (spec_logged_at_ != Clock::time_point{})
          log_info("speculative decoding: {}",
                   spec_decode_stats_line(stats_.spec_num_drafts, stats_.spec_num_draft_tokens,
                                          stats_.spec_num_accepted_tokens,
                                          stats_.spec_accepted_per_position));
        spec_logged_at_ = t;
      }
    }
    // max_tokens 0 with prompt_logprobs: done once the prompt is scored.
    for (const ScheduledSeq& s : so.seqs) {
      Sequence& seq = *s.seq;
      if (!seq.finished() && seq.prefill_done() &&
          seq.num_output_tokens() >= seq.params().max_tokens)
        finish_sequence(seq, FinishReason::kLength);
    }
    ++stats_.num_steps;
    // EPLB: between steps, the redundant experts follow the load counted since the last time.
    if (const int every = model_.eplb_step_interval(); every > 0 && stats_.num_steps % every == 0) {
      ++stats_.eplb_rebalances;
      stats_.eplb_layers_moved += runner_->rebalance_experts();
    }
    stats_.step_seconds += seconds(Clock::now() - step_start);
  }
  for (auto& o : parked_) out.finished.push_back(std::move(o));
  parked_.clear();
  for (auto& req : done_) {
    out.finished.push_back(make_output(*req));
    returned_.push_back(std::move(req));
  }
  done_.clear();
  return out;
}

bool LLMEngine::has_unfinished() const {
  return scheduler_.has_unfinished() || !done_.empty() || !parked_.empty();
}

RequestOutput LLMEngine::make_output(const Request& req) const {
  RequestOutput o;
  o.request_id = req.id;
  o.prompt_token_ids = req.prompt;
  // Copies, not moves: this step's token events still point into the sequences.
  o.prompt_logprobs = req.prompt_logprobs;
  o.finished = req.finished();
  Clock::time_point last = req.arrival;
  Clock::time_point scheduled{}, first_token{};
  for (const auto& seq : req.seqs) {
    if (seq->first_scheduled != Clock::time_point{} &&
        (scheduled == Clock::time_point{} || seq->first_scheduled < scheduled))
      scheduled = seq->first_scheduled;
    if (!seq->token_times.empty() &&
        (first_token == Clock::time_point{} || seq->token_times.front() < first_token))
      first_token = seq->token_times.front();
    CompletionOutput c;
    c.index = seq->index;
    c.text = seq->text;
    c.token_ids.assign(seq->tokens.begin() + seq->num_prompt_tokens, seq->tokens.end());
    c.logprobs = seq->logprobs;
    c.finish_reason = seq->finish_reason;
    c.stop_reason = seq->stop_reason;
    c.num_cached_tokens = std::max(0, seq->num_cached_tokens);
    c.num_preemptions = seq->num_preemptions;
    for (const auto& t : seq->token_times) c.token_times.push_back(seconds(t - req.arrival));
    if (!c.token_times.empty()) {
      c.ttft = c.token_times.front();
      if (c.token_times.size() > 1)
        c.tpot = (c.token_times.back() - c.token_times.front()) /
                 static_cast<double>(c.token_times.size() - 1);
      last = std::max(last, seq->token_times.back());
    }
    o.outputs.push_back(std::move(c));
  }
  o.e2e_latency = seconds((o.finished ? last : Clock::now()) - req.arrival);
  if (scheduled != Clock::time_point{}) {
    o.scheduled = true;
    o.queue_time = seconds(scheduled - req.arrival);
    if (first_token != Clock::time_point{}) {
      o.produced = true;
      o.prefill_time = seconds(first_token - scheduled);
      o.decode_time = seconds(last - first_token);
      o.inference_time = seconds(last - scheduled);
    }
  }
  return o;
}

std::optional<RequestOutput> LLMEngine::abort(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return std::nullopt;
  std::unique_ptr<Request> req = std::move(it->second);
  requests_.erase(it);
  for (auto& seq : req->seqs) {
    if (seq->finish_reason != FinishReason::kNone) continue;
    seq->finish_reason = FinishReason::kAbort;
    scheduler_.finish(seq.get());  // returns its blocks and slots, wherever it was
    ++req->num_finished;
  }
  return make_output(*req);
}

std::vector<RequestOutput> LLMEngine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                               const SamplingParams& params) {
  return generate(prompts, std::vector<SamplingParams>(prompts.size(), params));
}

std::vector<RequestOutput> LLMEngine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                               const std::vector<SamplingParams>& params) {
  ATOM_CHECK(params.size() == prompts.size(), "generate: {} prompts but {} parameter sets",
             prompts.size(), params.size());
  std::unordered_map<std::string, size_t> index;
  std::vector<RequestOutput> results(prompts.size());
  try {
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::string id = "generate-" + std::to_string(next_generate_id_++);
      add_request(id, prompts[i], params[i]);
      index.emplace(id, i);
    }
  } catch (...) {
    for (const auto& [id, i] : index) abort(id);
    throw;
  }
  size_t remaining = prompts.size();
  while (remaining > 0 && has_unfinished()) {
    StepOutput s = step();
    for (auto& o : s.finished) {
      auto it = index.find(o.request_id);
      if (it == index.end()) {  // queued by add_request: hand it out at the next step()
        parked_.push_back(std::move(o));
        continue;
      }
      results[it->second] = std::move(o);
      --remaining;
    }
  }
  return results;
}

EngineStats LLMEngine::stats() const {
  EngineStats s = stats_;
  s.num_preemptions = scheduler_.stats().num_preemptions;
  s.prefix_cache_queries = scheduler_.stats().prefix_cache_queries;
  s.prefix_cache_hits = scheduler_.stats().prefix_cache_hits;
  return s;
}

}  // namespace atom
