#include "core/convert.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace atom {

namespace {

bool is_convertible_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF64;
}

float load_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF64:
      return static_cast<float>(static_cast<const double*>(p)[i]);
    case DType::kI32:
      return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case DType::kI64:
      return static_cast<float>(static_cast<const int64_t*>(p)[i]);
    case DType::kU8:
      return static_cast<float>(static_cast<const uint8_t*>(p)[i]);
    case DType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(p)[i]);
    default:
      ATOM_CHECK(false, "cannot read {} as float", dtype_name(t));
  }
}

void store_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      break;
    case DType::kF64:
      static_cast<double*>(p)[i] = v;
      break;
    default:
      ATOM_CHECK(false, "cannot write float into {}", dtype_name(t));
  }
}

// Converts a contiguous host buffer of n elements.
void convert_contiguous(void* dst, DType dt, const void* src, DType st, int64_t n) {
  if (dt == st) {
    std::memcpy(dst, src, dtype_bytes(dt, static_cast<uint64_t>(n)));
    return;
  }
  // Reached by checkpoint data (a tensor stored as integers where the model wants floats): a
  // sentence for the user, which the loader prefixes with the tensor and the folder.
  if (!is_convertible_float(dt) || !is_convertible_float(st))
    fail("it is stored as {}, which atom cannot convert to {} (it converts between F32, BF16, F16 "
         "and F64)",
         dtype_name(st), dtype_name(dt));
  if (st == DType::kF64 && dt == DType::kF32) {
    for (int64_t i = 0; i < n; ++i)
      static_cast<float*>(dst)[i] = static_cast<float>(static_cast<const double*>(src)[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_float(dst, dt, i, load_float(src, st, i));
}

}  // namespace

void tensor_assign(Tensor& dst, const Tensor& src) {
  ATOM_CHECK(dst.shape() == src.shape(), "assign {} into {}: shapes differ", src.str(), dst.str());
  ATOM_CHECK(dst.is_contiguous(), "assign into non-contiguous {}", dst.str());
  if (dst.dtype() == src.dtype()) {
    dst.copy_from(src);
    return;
  }
  ATOM_CHECK(src.device().is_cpu(), "conversion from {} needs a CPU source", src.str());
  const Tensor s = src.contiguous();
  if (dst.device().is_cpu()) {
    convert_contiguous(dst.data(), dst.dtype(), s.data(), s.dtype(), s.numel());
  } else {
    Tensor tmp = Tensor::empty(dst.shape(), dst.dtype(), Device::cpu());
    convert_contiguous(tmp.data(), tmp.dtype(), s.data(), s.dtype(), s.numel());
    dst.copy_from(tmp);
  }
}

Tensor tensor_cast_cpu(const Tensor& src, DType dtype) {
  const Tensor s = src.device().is_cpu() ? src.contiguous() : src.to(Device::cpu());
  Tensor out = Tensor::empty(s.shape(), dtype, Device::cpu());
  convert_contiguous(out.data(), dtype, s.data(), s.dtype(), s.numel());
  return out;
}

float tensor_get_float(const Tensor& t, int64_t i) {
  ATOM_CHECK(t.device().is_cpu() && t.is_contiguous(),
             "tensor_get_float needs a contiguous CPU tensor");
  return load_float(t.data(), t.dtype(), i);
}

}  // namespace atom
