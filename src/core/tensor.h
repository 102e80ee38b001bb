// Tensor: a typed, shaped, strided view of a Storage on a device. Cheap to copy (shares storage).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace atom {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu());
  // A view of memory someone else owns; `owner` keeps it alive (may be null for static data).
  static Tensor wrap(void* data, Shape shape, DType dtype, Device device,
                     std::shared_ptr<void> owner);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;
  int64_t stride(int d) const;
  int64_t numel() const { return shape_numel(shape_); }
  uint64_t nbytes() const { return dtype_bytes(dtype_, static_cast<uint64_t>(numel())); }
  bool is_contiguous() const;

  void* data() const;
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data());
  }

  // Views. view() needs a contiguous tensor; one dimension may be -1.
  Tensor view(Shape shape) const;
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  Tensor select(int dim, int64_t index) const;

  // Copies.
  Tensor to(Device device) const;
  Tensor clone() const;
  Tensor contiguous() const;
  // Copies src (same shape and dtype) into this tensor, across devices too.
  void copy_from(const Tensor& src);
  void zero_();

  std::string str() const;  // "BF16[4, 8] on cpu"

 private:
  std::shared_ptr<void> owner_;  // keeps the memory alive (a Storage, an mmap, ...)
  void* storage_ = nullptr;      // base address
  int64_t offset_ = 0;           // in elements
  DType dtype_ = DType::kF32;
  Device device_;
  Shape shape_;
  Shape strides_;  // in elements
};

Shape contiguous_strides(const Shape& shape);

}  // namespace atom
