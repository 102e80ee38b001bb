// One safetensors file: header parsing with every validation rule of the format, and tensor
// access through mmap (default) or plain reads (ATOM_DISABLE_MMAP=true).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace atom {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data buffer, [begin, end)
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_len = 0;  // N: bytes of JSON after the 8-byte length
  uint64_t file_size = 0;
  std::vector<SafetensorsEntry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start() const { return 8 + header_len; }
  const SafetensorsEntry* find(const std::string& name) const;
};

// Largest header the format allows (safetensors' MAX_HEADER_SIZE).
constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

// Reads and validates only the header (8 + N bytes). Every rule violation is an Error naming the
// file and, where one is at fault, the tensor.
SafetensorsHeader safetensors_read_header(const std::string& path);
// Validates a header already in memory (bytes = the whole file, or at least 8 + N of it).
SafetensorsHeader safetensors_parse_header(const std::string& path, const uint8_t* bytes,
                                           uint64_t available, uint64_t file_size);

class SafetensorsFile {
 public:
  // use_mmap=false reads the whole data buffer into memory at open.
  SafetensorsFile(std::string path, bool use_mmap);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // A CPU tensor viewing the file's bytes; it keeps the file mapping alive.
  Tensor tensor(const SafetensorsEntry& e) const;
  Tensor tensor(const std::string& name) const;

 private:
  std::string path_;
  SafetensorsHeader header_;
  std::shared_ptr<void> mapping_;  // the mmap or the read buffer, whole file
  const uint8_t* base_ = nullptr;
};

// Writes tensors (CPU) into a safetensors file, in the given order. Used by `atom score` and
// tests.
void safetensors_write(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace atom
