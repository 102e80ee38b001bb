#include "engine/engine_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace atom {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The largest block and state slot over `model` and the ranks of `group` in this process.
std::pair<size_t, size_t> largest_block_and_slot(ModelGroup* group, const Model& model,
                                                 DType kv_cache_dtype, int block_size) {
  std::vector<const Model*> ranks{&model};
  if (group)
    for (int r = 0; r < group->world_size(); ++r)
      if (group->holds(r) && &group->model(r) != &model) ranks.push_back(&group->model(r));
  size_t block = 0, slot = 0;
  for (const Model* m : ranks) {
    block = std::max(
        block,
        KvCache::page_bytes(cache_specs_with_dtype(m->cache_specs(), kv_cache_dtype), block_size));
    slot = std::max(slot, KvCache::state_slot_bytes(m->state_specs()));
  }
  return {block, slot};
}
}  // namespace

std::string kv_cache_plan_reply(ModelGroup& group, Wire& command) {
  const auto kv = static_cast<DType>(command.i64());
  const int block_size = static_cast<int>(command.i64());
  const auto [block, slot] = largest_block_and_slot(&group, group.model(), kv, block_size);
  Wire r;
  r.put_i64(static_cast<int64_t>(block));
  r.put_i64(static_cast<int64_t>(slot));
  return r.buffer();
}

KvCachePlan kv_cache_plan(const Model& model, const EngineConfig& c, ModelGroup* group) {
  KvCachePlan p;
  if (c.block_size < 1) fail("block_size must be at least 1, got {}", c.block_size);
  if (c.max_num_seqs < 1) fail("max_num_seqs must be at least 1, got {}", c.max_num_seqs);
  if (!(c.gpu_memory_utilization > 0 && c.gpu_memory_utilization <= 1))
    fail("gpu_memory_utilization must be in (0, 1], got {}", c.gpu_memory_utilization);
  if (c.num_speculative_tokens < 0)
    fail("num_speculative_tokens must be >= 0, got {}", c.num_speculative_tokens);
  const int64_t model_max = model.config().max_position_embeddings;
  p.max_model_len = c.max_model_len > 0 ? c.max_model_len : static_cast<int>(model_max);
  if (c.max_model_len < 0) fail("max_model_len must be positive, got {}", c.max_model_len);
  if (p.max_model_len > model_max)
    fail("max_model_len {} is larger than the model's max_position_embeddings {}", p.max_model_len,
         model_max);
  p.block_size = c.block_size;
  p.kv_cache_dtype = kv_cache_dtype_for(model, c.kv_cache_dtype);
  if (group && group->multi_node()) {
    Wire w;
    w.put_str("plan");
    w.put_i64(static_cast<int64_t>(p.kv_cache_dtype));
    w.put_i64(c.block_size);
    group->post(w.buffer());
  }
  std::tie(p.block_bytes, p.state_slot_bytes) =
      largest_block_and_slot(group, model, p.kv_cache_dtype, c.block_size);
  if (group && group->multi_node()) {
    for (const std::string& r : group->collect()) {
      Wire w(r);
      p.block_bytes = std::max(p.block_bytes, static_cast<size_t>(w.i64()));
      p.state_slot_bytes = std::max(p.state_slot_bytes, static_cast<size_t>(w.i64()));
    }
  }
  // A group agreed at load whether any rank (of any node) keeps recurrent state.
  const bool recurrent = group ? group->recurrent() : !model.state_specs().empty();
  if (c.state_checkpoint_interval_tokens < 0 ||
      c.state_checkpoint_interval_tokens % c.block_size != 0)
    fail("state_checkpoint_interval_tokens must be a non-negative multiple of block_size {}, got "
         "{}",
         c.block_size, c.state_checkpoint_interval_tokens);
  if (c.num_state_checkpoints < 0)
    fail("num_state_checkpoints must be >= 0, got {}", c.num_state_checkpoints);
  if (recurrent) {
    p.state_slots_per_request = 1 + c.num_speculative_tokens;
    p.num_state_slots = c.max_num_seqs * p.state_slots_per_request;
    // Prefix checkpoints (by default as many as sequences run at once), reused least recently
    // used first.
    if (c.enable_prefix_caching && c.state_checkpoint_interval_tokens > 0)
      p.num_checkpoint_slots =
          c.num_state_checkpoints > 0 ? c.num_state_checkpoints : c.max_num_seqs;
    p.num_state_slots += p.num_checkpoint_slots;
  }
  const int64_t state_bytes = static_cast<int64_t>(p.state_slot_bytes) * p.num_state_slots;
  const int64_t per_seq_blocks = ceil_div(p.max_model_len, c.block_size);
  const int64_t useful = per_seq_blocks * c.max_num_seqs;
  if (c.kv_cache_memory < 0) fail("kv_cache_memory must be positive, got {}", c.kv_cache_memory);
  const int64_t kv_bytes = c.kv_cache_memory > 0 ? c.kv_cache_memory : kCpuKvCacheMemory;
  if (c.num_gpu_blocks_override > 0) {
    // Cache slots (block * block_size + offset) are int32 in every batch.
    if (c.num_gpu_blocks_override > INT32_MAX / c.block_size)
      fail("--num-gpu-blocks-override {} blocks of {} tokens is more cache slots than 32-bit slot "
           "numbers address (at most {} blocks at this --block-size)",
           c.num_gpu_blocks_override, c.block_size, INT32_MAX / c.block_size);
    p.num_blocks = c.num_gpu_blocks_override;
  } else if (model.device().is_cuda() && c.kv_cache_memory <= 0) {
    p.from_gpu_memory = true;  // the runner profiles a step and measures what is left
    return p;
  } else {
    const int64_t left = kv_bytes - state_bytes;
    if (left <= 0)
      fail(
          "kv cache memory {} bytes cannot hold the recurrent state pool: {} slots x {} bytes = {} "
          "bytes; raise --kv-cache-memory or lower --max-num-seqs",
          kv_bytes, p.num_state_slots, p.state_slot_bytes, state_bytes);
    const int64_t fit = p.block_bytes > 0 ? left / static_cast<int64_t>(p.block_bytes) : useful;
    p.num_blocks = static_cast<int>(std::min<int64_t>({fit, useful, INT32_MAX / c.block_size}));
  }
  if (p.num_blocks < per_seq_blocks) {
    const std::string source =
        c.num_gpu_blocks_override > 0
            ? fmt::format("set by --num-gpu-blocks-override")
            : fmt::format("from --kv-cache-memory {} bytes minus {} bytes of state slots", kv_bytes,
                          state_bytes);
    fail("the KV cache holds {} blocks of {} tokens = {} tokens ({} bytes per block, {}), but one "
         "sequence of max_model_len {} needs {} blocks ({} bytes); raise --kv-cache-memory or "
         "--num-gpu-blocks-override, or lower --max-model-len",
         p.num_blocks, c.block_size, static_cast<int64_t>(p.num_blocks) * c.block_size,
         p.block_bytes, source, p.max_model_len, per_seq_blocks,
         per_seq_blocks * static_cast<int64_t>(p.block_bytes));
  }
  return p;
}

std::optional<DType> kv_cache_dtype_parse(const std::string& name) {
  if (name == "auto") return std::nullopt;
  if (name == "fp8" || name == "fp8_e4m3") return DType::kF8E4M3;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  fail("--kv-cache-dtype '{}': expected auto, fp8, fp8_e4m3, bf16 or bfloat16{}", name,
       name.starts_with("fp8") ? " (FP8 caches are e4m3 only)" : "");
}

DType kv_cache_dtype_for(const Model& model, const std::string& name) {
  const DType act = model.act_dtype();
  const DType t = kv_cache_dtype_parse(name).value_or(act);
  // The CUDA attention kernels read caches of the activation dtype or e4m3; the CPU reference
  // reads any float dtype.
  if (model.device().is_cuda() && t != act && t != DType::kF8E4M3)
    fail("--kv-cache-dtype {}: on {} the KV cache holds the activation dtype {} or fp8, not {}",
         name, model.device().str(), dtype_name(act), dtype_name(t));
  // Row planes (CacheKind::kRows: DeepSeek-V4's window and compressed rows) are read in the
  // activation dtype by every backend so far; one that keeps its own dtype is not converted.
  if (t != act)
    for (const CacheSpec& s : model.cache_specs())
      if (s.kind == CacheKind::kRows && !s.keeps_dtype)
        fail("--kv-cache-dtype {}: {} keeps its key/value rows (sliding-window and compressed "
             "rows) in the activation dtype {} only; {} caches are not supported for it yet",
             name, model.config().architectures.at(0), dtype_name(act), dtype_name(t));
  return t;
}

int64_t token_count_parse(const std::string& s, const std::string& flag) {
  auto bad = [&]() -> int64_t {
    fail("{} '{}': expected a positive whole number, optionally with k/m/g (x1000) or K/M/G "
         "(x1024), e.g. 32768, 32k or 32K",
         flag, s);
  };
  if (s.empty()) return bad();
  const char last = s.back();
  double mult = 1;
  bool binary = false;
  std::string num = s;
  if (std::string("kmgKMG").find(last) != std::string::npos) {
    num.pop_back();
    const int power = last == 'k' || last == 'K' ? 1 : last == 'm' || last == 'M' ? 2 : 3;
    binary = std::isupper(static_cast<unsigned char>(last));
    mult = std::pow(binary ? 1024.0 : 1000.0, power);
  }
  if (num.empty() || num.find_first_not_of("0123456789.") != std::string::npos ||
      std::count(num.begin(), num.end(), '.') > 1 || (binary && num.find('.') != std::string::npos))
    return bad();
  const double v = std::stod(num) * mult;
  if (!(v >= 1) || v > 2147483647.0 || v != std::floor(v)) return bad();
  return static_cast<int64_t>(v);
}

int64_t byte_size_parse(const std::string& s, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  unit.erase(
      std::remove_if(unit.begin(), unit.end(), [](unsigned char ch) { return std::isspace(ch); }),
      unit.end());
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "gb")
    mult = 1e9;
  if (end == s.c_str() || mult == 0 || !(v > 0))
    fail("{} '{}': expected a positive size such as 4GiB, 512MiB or 1000000 (bytes)", flag, s);
  return static_cast<int64_t>(v * mult);
}

}  // namespace atom
