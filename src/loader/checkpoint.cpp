#include "loader/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"

namespace atom {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The real path of `file` (a shard named by the index, or found in the folder). The index is data
// from the hub, so a name in it that is absolute or climbs out with ".." is refused: it must not
// make atom open another file. A symlink in the folder is followed wherever it leads, as
// transformers and vLLM do: the user made it (shards on another disk, a folder assembled from
// several, the Hugging Face cache's snapshots/<rev>/<file> -> ../../blobs/<hash>), and what it
// opens is still validated as a safetensors file.
fs::path shard_inside(const fs::path& dir, const std::string& file, const std::string& source) {
  const fs::path rel(file);
  if (file.empty() || rel.is_absolute() || rel.has_root_name() || rel.has_root_directory())
    fail("{}: shard '{}' is not a path relative to the model folder", source, file);
  for (const auto& part : rel.lexically_normal())
    if (part == "..") fail("{}: shard '{}' points outside the model folder", source, file);
  const fs::path p = dir / rel;
  std::error_code ec;
  if (!fs::exists(p, ec)) fail("{}: shard '{}' named in the index is missing", source, file);
  const fs::path real = fs::canonical(p, ec);
  if (ec) fail("{}: cannot resolve shard '{}': {}", source, file, ec.message());
  if (!fs::is_regular_file(real, ec))
    fail("{}: shard '{}' resolves to {}, which is not a regular file", source, file, real.string());
  return real;
}

}  // namespace

CheckpointReadOptions checkpoint_options_from_env() {
  CheckpointReadOptions o;
  o.use_mmap = !env_bool("ATOM_DISABLE_MMAP", false);
  const long n = env_int("ATOM_LOADER_NUM_THREADS", 16);
  if (n < 1) fail("ATOM_LOADER_NUM_THREADS={} must be at least 1", n);
  o.num_threads = static_cast<int>(n);
  return o;
}

Checkpoint::Checkpoint(std::string dir) : dir_(std::move(dir)) {
  if (!fs::is_directory(dir_)) fail("model folder '{}' does not exist or is not a folder", dir_);
  const fs::path index = fs::path(dir_) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    has_index_ = true;
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", index.string(), e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: missing the 'weight_map' object", index.string());
    std::set<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        fail("{}: weight_map entry '{}' is not a file name", index.string(), it.key());
      weight_map_[it.key()] = it.value().get<std::string>();
      files.insert(it.value().get<std::string>());
    }
    for (const auto& f : files) {
      shard_inside(dir_, f, index.string());
      shards_.push_back((fs::path(dir_) / f).string());
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") {
        shard_inside(dir_, e.path().filename().string(), dir_);
        shards_.push_back(e.path().string());
      }
    std::sort(shards_.begin(), shards_.end());
    if (shards_.empty()) fail("model folder '{}' holds no .safetensors files", dir_);
  }
}

bool Checkpoint::is_canonical(const std::string& name, const std::string& file) const {
  if (!has_index_) return true;
  auto it = weight_map_.find(name);
  return it == weight_map_.end() || it->second == file;
}

std::vector<std::pair<std::string, SafetensorsHeader>> Checkpoint::headers() const {
  std::vector<std::pair<std::string, SafetensorsHeader>> r;
  for (const auto& p : shards_) r.emplace_back(p, safetensors_read_header(p));
  if (has_index_) {
    // Every tensor the index names must be in the shard it names.
    std::set<std::pair<std::string, std::string>> present;
    for (const auto& [path, h] : r)
      for (const auto& e : h.entries) present.insert({fs::path(path).filename().string(), e.name});
    for (const auto& [name, file] : weight_map_)
      if (!present.count({file, name}))
        fail("{}/model.safetensors.index.json: tensor '{}' should be in shard '{}' but is not",
             dir_, name, file);
  }
  return r;
}

CheckpointStats Checkpoint::read(const Wants& wants, const Visit& visit,
                                 const CheckpointReadOptions& options) const {
  CheckpointStats stats;
  std::unique_ptr<ThreadPool> pool;
  if (options.num_threads > 1) pool = std::make_unique<ThreadPool>(options.num_threads);
  const auto all = headers();
  for (const auto& [path, header] : all) {
    ++stats.shards_total;
    const std::string file = fs::path(path).filename().string();
    std::vector<const SafetensorsEntry*> wanted;
    for (const auto& e : header.entries)
      if (is_canonical(e.name, file) && wants(e.name)) wanted.push_back(&e);
    if (wanted.empty()) {
      ++stats.shards_skipped;
      stats.bytes_skipped += header.file_size;
      continue;
    }
    ++stats.shards_read;
    stats.tensors_skipped += static_cast<int>(header.entries.size() - wanted.size());
    stats.tensors_yielded += static_cast<int>(wanted.size());
    SafetensorsFile shard(path, options.use_mmap);
    if (options.use_mmap) {
      for (const auto* e : wanted) stats.bytes_read += e->nbytes();
    } else {
      stats.bytes_read += header.file_size - header.data_start();
    }
    if (pool) {
      for (const auto* e : wanted) pool->submit([&, e] { visit(e->name, shard.tensor(*e)); });
      pool->wait();
    } else {
      for (const auto* e : wanted) visit(e->name, shard.tensor(*e));
    }
    // Progress, shard by shard (a large checkpoint takes a while).
    if (all.size() > 1)
      log_info("weights: shard {}/{} read ({:.1f} MB so far)", stats.shards_total, all.size(),
               static_cast<double>(stats.bytes_read) / 1e6);
  }
  return stats;
}

}  // namespace atom
