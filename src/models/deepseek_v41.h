// DeepSeek-V4.1 (DeepseekV41ForCausalLM), text only, on the CPU: models/deepseek_v41.cpp. The
// config and CSA2 topology are models/deepseek_v41_config.h; docs/deepseek_v41.md describes both.
// Declared here: the two discrete choices of the CSA2 index, which the model makes per query and
// tests/models/deepseek_v41_test.cpp checks on hand-made scores.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace atom {

// The candidate blocks a candidate-source layer keeps for one query: `scores` are its index
// scores of the query's visible compressed rows; rows [b B, (b + 1) B) form block b (B =
// block_size); a block's score is its best row's, and the newest block (the one holding the last
// visible row) is always kept. The `count` best blocks (ties: the smaller block), ascending.
std::vector<int64_t> v41_candidate_blocks(std::span<const float> scores, int64_t block_size,
                                          int64_t count);

// The rows one query attends to: the `topk` best-scored visible rows (ties: the smaller row, or
// the larger with large_position — index_topk_tie_break), restricted to `candidates` (blocks of
// block_size rows, from the candidate source) when given; every allowed row when there are no
// more than topk. Ascending.
std::vector<int64_t> v41_select_rows(std::span<const float> scores, int64_t topk,
                                     const std::vector<int64_t>* candidates, int64_t block_size,
                                     bool large_position = false);

}  // namespace atom
