#include "core/dtype.h"

#include "core/error.h"

namespace atom {

namespace {
struct DTypeInfo {
  DType t;
  std::string_view name;
  int bits;
  bool is_float;
};
constexpr DTypeInfo kInfos[] = {
    {DType::kBool, "BOOL", 8, false},
    {DType::kU8, "U8", 8, false},
    {DType::kI8, "I8", 8, false},
    {DType::kI16, "I16", 16, false},
    {DType::kU16, "U16", 16, false},
    {DType::kI32, "I32", 32, false},
    {DType::kU32, "U32", 32, false},
    {DType::kI64, "I64", 64, false},
    {DType::kU64, "U64", 64, false},
    {DType::kF16, "F16", 16, true},
    {DType::kBF16, "BF16", 16, true},
    {DType::kF32, "F32", 32, true},
    {DType::kF64, "F64", 64, true},
    {DType::kF8E4M3, "F8_E4M3", 8, true},
    {DType::kF8E5M2, "F8_E5M2", 8, true},
    {DType::kE8M0, "F8_E8M0", 8, true},
    {DType::kF4, "F4", 4, true},
    {DType::kF6E2M3, "F6_E2M3", 6, true},
    {DType::kF6E3M2, "F6_E3M2", 6, true},
    {DType::kF8E4M3FNUZ, "F8_E4M3FNUZ", 8, true},
    {DType::kF8E5M2FNUZ, "F8_E5M2FNUZ", 8, true},
    {DType::kC64, "C64", 64, false},
};

const DTypeInfo& info(DType t) {
  for (const auto& i : kInfos)
    if (i.t == t) return i;
  ATOM_CHECK(false, "unknown dtype {}", static_cast<int>(t));
}
}  // namespace

int dtype_bits(DType t) { return info(t).bits; }
std::string_view dtype_name(DType t) { return info(t).name; }
bool dtype_is_float(DType t) { return info(t).is_float; }

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (const auto& i : kInfos)
    if (i.name == s) return i.t;
  return std::nullopt;
}

std::optional<DType> dtype_from_torch_name(std::string_view s) {
  if (s.starts_with("torch.")) s.remove_prefix(6);
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16" || s == "half") return DType::kF16;
  if (s == "float32" || s == "float") return DType::kF32;
  if (s == "float64" || s == "double") return DType::kF64;
  if (s == "float8_e4m3fn") return DType::kF8E4M3;
  if (s == "float8_e5m2") return DType::kF8E5M2;
  return std::nullopt;
}

uint64_t dtype_bytes(DType t, uint64_t n) {
  const uint64_t bits = static_cast<uint64_t>(dtype_bits(t));
  ATOM_CHECK(n == 0 || bits <= UINT64_MAX / n, "element count {} overflows", n);
  ATOM_CHECK((n * bits) % 8 == 0, "{} elements of {} do not fill whole bytes", n, dtype_name(t));
  return n * bits / 8;
}

}  // namespace atom
