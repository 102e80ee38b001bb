#include "core/tensor.h"

#include <cstring>

#include "core/error.h"

namespace atom {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (auto d : shape) ATOM_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  auto storage =
      storage_alloc(dtype_bytes(dtype, static_cast<uint64_t>(shape_numel(shape))), device);
  Tensor t;
  t.storage_ = storage->data();
  t.owner_ = std::move(storage);
  t.dtype_ = dtype;
  t.device_ = device;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, Device device,
                    std::shared_ptr<void> owner) {
  Tensor t;
  t.storage_ = data;
  t.owner_ = std::move(owner);
  if (!t.owner_) t.owner_ = std::shared_ptr<void>(data, [](void*) {});
  t.dtype_ = dtype;
  t.device_ = device;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

int64_t Tensor::size(int d) const {
  if (d < 0) d += dim();
  ATOM_CHECK(d >= 0 && d < dim(), "dimension {} out of range for {}", d, str());
  return shape_[d];
}

int64_t Tensor::stride(int d) const {
  if (d < 0) d += dim();
  ATOM_CHECK(d >= 0 && d < dim(), "dimension {} out of range for {}", d, str());
  return strides_[d];
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

void* Tensor::data() const {
  if (!storage_) return nullptr;
  const uint64_t byte_off = dtype_bytes(dtype_, static_cast<uint64_t>(offset_));
  return static_cast<char*>(storage_) + byte_off;
}

Tensor Tensor::view(Shape shape) const {
  ATOM_CHECK(is_contiguous(), "view of a non-contiguous tensor {}", str());
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      ATOM_CHECK(infer < 0, "view shape {} has two -1", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    ATOM_CHECK(known > 0 && numel() % known == 0, "cannot view {} as {}", str(), shape_str(shape));
    shape[infer] = numel() / known;
  }
  ATOM_CHECK(shape_numel(shape) == numel(), "cannot view {} as {}", str(), shape_str(shape));
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::narrow(int d, int64_t start, int64_t length) const {
  if (d < 0) d += dim();
  ATOM_CHECK(d >= 0 && d < dim(), "narrow dimension {} out of range for {}", d, str());
  ATOM_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
             "narrow [{}, {}) out of range for dimension {} of {}", start, start + length, d,
             str());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = length;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  if (d < 0) d += dim();
  Tensor t = narrow(d, index, 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

namespace {
// Copies a strided tensor into a contiguous host buffer, element by element (bytes-sized dtypes).
void gather_strided(char* dst, const Tensor& src) {
  const int64_t esz = dtype_bits(src.dtype()) / 8;
  ATOM_CHECK(esz > 0, "strided copy of sub-byte dtype {}", dtype_name(src.dtype()));
  const int nd = src.dim();
  std::vector<int64_t> idx(nd, 0);
  const char* base = static_cast<const char*>(src.data());
  const int64_t n = src.numel();
  // Innermost run is copied as a block when its stride is 1.
  const int64_t inner = nd ? src.shape()[nd - 1] : 1;
  const bool inner_contig = nd == 0 || src.strides()[nd - 1] == 1;
  for (int64_t done = 0; done < n;) {
    int64_t off = 0;
    for (int i = 0; i < nd; ++i) off += idx[i] * src.strides()[i];
    if (inner_contig) {
      std::memcpy(dst + done * esz, base + off * esz, static_cast<size_t>(inner * esz));
      done += inner;
      if (nd) idx[nd - 1] = inner - 1;
    } else {
      std::memcpy(dst + done * esz, base + off * esz, static_cast<size_t>(esz));
      ++done;
    }
    for (int i = nd - 1; i >= 0; --i) {
      if (++idx[i] < src.shape()[i]) break;
      idx[i] = 0;
    }
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  ATOM_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy from {} into {}", src.str(),
             str());
  ATOM_CHECK(is_contiguous(), "copy into a non-contiguous tensor {}", str());
  if (src.is_contiguous()) {
    memory_copy(data(), device_, src.data(), src.device_, nbytes());
    return;
  }
  ATOM_CHECK(src.device_.is_cpu(), "strided copy from {} needs a contiguous source", src.str());
  if (device_.is_cpu()) {
    gather_strided(static_cast<char*>(data()), src);
  } else {
    Tensor tmp = Tensor::empty(shape_, dtype_, Device::cpu());
    gather_strided(static_cast<char*>(tmp.data()), src);
    memory_copy(data(), device_, tmp.data(), tmp.device_, nbytes());
  }
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const { return to(device_); }

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

void Tensor::zero_() {
  ATOM_CHECK(is_contiguous(), "zero_ of a non-contiguous tensor {}", str());
  memory_zero(data(), device_, nbytes());
}

std::string Tensor::str() const {
  return fmt::format("{}{} on {}", dtype_name(dtype_), shape_str(shape_), device_.str());
}

}  // namespace atom
