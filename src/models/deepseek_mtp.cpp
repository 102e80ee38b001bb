#include "models/deepseek_mtp.h"

#include "kernels/elementwise.h"

namespace atom {

Tensor mtp_concat_columns(Step& step, const Tensor& a, const Tensor& b) {
  const int64_t T = a.size(0), A = a.size(1);
  ATOM_CHECK(b.size(0) == T && b.size(1) == A && a.dtype() == b.dtype(),
             "mtp_concat_columns: {} and {}", a.str(), b.str());
  // Each half of the columns written in place (two strided row copies): no host data, so a
  // CUDA graph can capture it.
  Tensor out = step.empty({T, 2 * A}, a.dtype());
  Tensor left = out.narrow(1, 0, A), right = out.narrow(1, A, A);
  kernels::cast(left, a);
  kernels::cast(right, b);
  return out;
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
