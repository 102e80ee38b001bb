// Where memory lives, and the raw allocation and copy primitives every tensor uses.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace atom {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

// "cpu", "cuda", "cuda:1"; throws naming the text when it is none of those.
Device device_parse(std::string_view s);
// True when this build has the CUDA backend and a GPU is visible.
bool cuda_available();
// The device a command uses when the user names none: cuda when a GPU is present, else cpu.
Device device_default();
// GPUs visible to this process (0 without the CUDA backend or a driver).
int cuda_device_count();
// Makes `d` the calling thread's current CUDA device (nothing for the CPU). Kernels, copies and
// allocations go to the thread's current device, so each tensor-parallel rank keeps a thread whose
// current device is its own.
void device_make_current(Device d);
// Waits for all work queued on device `d`, from any thread (nothing for the CPU); the calling
// thread's current device is left as it was.
void device_synchronize(Device d);

// A block of bytes on a device, freed by its release function.
class Storage {
 public:
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> release)
      : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}
  ~Storage() {
    if (release_) release_(data_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  std::function<void(void*)> release_;
};

std::shared_ptr<Storage> storage_alloc(size_t nbytes, Device device);
// Copies n bytes between any two devices (synchronous).
void memory_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n);
void memory_zero(void* dst, Device dev, size_t n);

}  // namespace atom
