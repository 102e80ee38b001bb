// A Hugging Face checkpoint folder: its safetensors shards (sharded through
// model.safetensors.index.json, with duplicates filtered), read tensor by tensor through a
// wants(name) predicate. A shard holding nothing wanted is skipped from its header alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "loader/safetensors.h"

namespace atom {

struct CheckpointStats {
  int shards_total = 0;
  int shards_read = 0;
  int shards_skipped = 0;
  uint64_t bytes_read = 0;     // bytes of tensor data read (whole shards without mmap)
  uint64_t bytes_skipped = 0;  // bytes of shards never read past their header
  int tensors_yielded = 0;
  int tensors_skipped = 0;  // present in a shard that was read, but not wanted
};

struct CheckpointReadOptions {
  bool use_mmap = true;  // false: plain reads of each shard (ATOM_DISABLE_MMAP=true)
  int num_threads = 1;   // tensors of one shard handed to fn from this many threads
};

// Reads ATOM_DISABLE_MMAP and ATOM_LOADER_NUM_THREADS (default 16).
CheckpointReadOptions checkpoint_options_from_env();

class Checkpoint {
 public:
  // Finds the shards of `dir`. With model.safetensors.index.json only the shards it names are
  // used (a named shard that is missing is an error); otherwise every *.safetensors file.
  explicit Checkpoint(std::string dir);

  const std::string& dir() const { return dir_; }
  const std::vector<std::string>& shard_paths() const { return shards_; }
  bool has_index() const { return has_index_; }

  // Headers of every shard (validated), without reading tensor data.
  std::vector<std::pair<std::string, SafetensorsHeader>> headers() const;

  using Wants = std::function<bool(const std::string& name)>;
  using Visit = std::function<void(const std::string& name, const Tensor& tensor)>;
  // Calls visit(name, tensor) for every tensor `wants` accepts. `visit` may run concurrently on
  // several threads (options.num_threads); tensors are CPU views valid during the call.
  CheckpointStats read(const Wants& wants, const Visit& visit,
                       const CheckpointReadOptions& options) const;

 private:
  // True when the tensor `name` found in shard `file` is the copy the index points to.
  bool is_canonical(const std::string& name, const std::string& file) const;

  std::string dir_;
  std::vector<std::string> shards_;  // full paths, sorted
  bool has_index_ = false;
  std::map<std::string, std::string> weight_map_;  // tensor -> shard file name (from the index)
};

}  // namespace atom
