#include "models/deepseek_mtp.h"

#include "core/device.h"
#include "kernels/elementwise.h"

namespace atom {

Tensor mtp_concat_columns(Step& step, const Tensor& a, const Tensor& b) {
  const int64_t T = a.size(0), A = a.size(1);
  ATOM_CHECK(b.size(0) == T && b.size(1) == A && a.dtype() == b.dtype(),
             "mtp_concat_columns: {} and {}", a.str(), b.str());
  // Rows [a_0 .. a_T-1, b_0 .. b_T-1] gathered as a_0, b_0, a_1, b_1, ...: read as [T, 2A], that
  // is each row of a followed by the same row of b.
  Tensor stacked = step.empty({2 * T, A}, a.dtype());
  stacked.narrow(0, 0, T).copy_from(a.contiguous());
  stacked.narrow(0, T, T).copy_from(b.contiguous());
  std::vector<int32_t> order(static_cast<size_t>(2 * T));
  for (int64_t i = 0; i < T; ++i) {
    order[static_cast<size_t>(2 * i)] = static_cast<int32_t>(i);
    order[static_cast<size_t>(2 * i + 1)] = static_cast<int32_t>(T + i);
  }
  Tensor index = step.empty({2 * T}, DType::kI32);
  memory_copy(index.data(), index.device(), order.data(), Device::cpu(), index.nbytes());
  Tensor out = step.empty({2 * T, A}, a.dtype());
  kernels::gather_rows(out, stacked, index);
  return out.view({T, 2 * A});
}

std::optional<std::string> deepseek_mtp_rewrite(const std::string& name, int64_t layer,
                                                int64_t num_hidden_layers) {
  if (layer < num_hidden_layers) return std::nullopt;  // the target's (or top-level) tensors
  const std::string head = "model.layers." + std::to_string(layer) + ".";
  if (!name.starts_with(head)) return name;  // unclaimed: the loader names it
  const std::string rest = name.substr(head.size());
  if (rest.starts_with("embed_tokens.")) return "model." + rest;
  for (const char* own : {"enorm.", "hnorm.", "eh_proj.", "shared_head."})
    if (rest.starts_with(own)) return name;
  return head + "mtp_block." + rest;
}

}  // namespace atom
