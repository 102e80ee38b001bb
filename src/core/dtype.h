// Element types: what safetensors can hold and what kernels compute in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace atom {

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,  // float8_e4m3fn
  kF8E5M2,
  kE8M0,  // power-of-two block scale (MX formats)
  kF4,    // e2m1, two values per byte
  kF6E2M3,
  kF6E3M2,
  kF8E4M3FNUZ,
  kF8E5M2FNUZ,
  kC64,
};

// Size of one element in bits (F4 is 4, F6 is 6).
int dtype_bits(DType t);
// Name as safetensors writes it ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; nullopt when unknown.
std::optional<DType> dtype_from_safetensors(std::string_view s);
// Parses a torch dtype name as config.json writes it ("bfloat16", "float32", ...).
std::optional<DType> dtype_from_torch_name(std::string_view s);
bool dtype_is_float(DType t);

// Bytes held by n elements; throws when n elements do not fill whole bytes.
uint64_t dtype_bytes(DType t, uint64_t n);

}  // namespace atom
