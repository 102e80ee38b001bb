// Checkpoint folders: sharding through the index, duplicate filtering, shard skipping from the
// header alone, and the errors for missing shards and tensors.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "loader/checkpoint.h"

namespace atom::test {
namespace {

namespace fs = std::filesystem;
const std::string kSharded = "llama_linear_sharded_f32";

CheckpointReadOptions opts(bool mmap, int threads) {
  CheckpointReadOptions o;
  o.use_mmap = mmap;
  o.num_threads = threads;
  return o;
}

TEST(Checkpoint, ShardedThroughTheIndex) {
  Checkpoint c(fixture_dir(kSharded));
  EXPECT_TRUE(c.has_index());
  EXPECT_EQ(c.shard_paths().size(), 2u);
  std::set<std::string> seen;
  std::mutex mu;
  const CheckpointStats s = c.read([](const std::string&) { return true; },
                                   [&](const std::string& name, const Tensor& t) {
                                     std::lock_guard<std::mutex> lock(mu);
                                     EXPECT_TRUE(seen.insert(name).second) << name;
                                     EXPECT_GT(t.numel(), 0);
                                   },
                                   opts(true, 4));
  EXPECT_EQ(s.shards_total, 2);
  EXPECT_EQ(s.shards_read, 2);
  EXPECT_EQ(s.shards_skipped, 0);
  EXPECT_EQ(seen.size(), 21u);  // 2 layers x 9 + embed + norm + lm_head
  EXPECT_EQ(static_cast<int>(seen.size()), s.tensors_yielded);
}

// A shard holding nothing wanted is skipped from its header: counted, never read.
TEST(Checkpoint, ShardWithNothingWantedIsSkipped) {
  Checkpoint c(fixture_dir(kSharded));
  const auto headers = c.headers();
  // Want exactly the tensors of the first shard.
  std::set<std::string> first;
  for (const auto& e : headers[0].second.entries) first.insert(e.name);
  const uint64_t second_size = fs::file_size(headers[1].first);
  for (bool mmap : {true, false}) {
    int visits = 0;
    const CheckpointStats s =
        c.read([&](const std::string& n) { return first.count(n) > 0; },
               [&](const std::string&, const Tensor&) { ++visits; }, opts(mmap, 1));
    EXPECT_EQ(s.shards_read, 1);
    EXPECT_EQ(s.shards_skipped, 1);
    EXPECT_EQ(s.bytes_skipped, second_size);
    EXPECT_EQ(visits, static_cast<int>(first.size()));
    uint64_t wanted_bytes = 0;
    for (const auto& e : headers[0].second.entries) wanted_bytes += e.nbytes();
    if (mmap) {
      EXPECT_EQ(s.bytes_read, wanted_bytes);  // only the wanted tensors are touched
    } else {
      EXPECT_GE(s.bytes_read, wanted_bytes);  // a plain read takes the whole shard
    }
  }
  // Wanting one tensor of the first shard still reads that shard (and skips the other).
  const std::string one = *first.begin();
  const CheckpointStats s = c.read([&](const std::string& n) { return n == one; },
                                   [](const std::string&, const Tensor&) {}, opts(true, 1));
  EXPECT_EQ(s.tensors_yielded, 1);
  EXPECT_EQ(s.tensors_skipped, static_cast<int>(first.size()) - 1);
  EXPECT_EQ(s.shards_skipped, 1);
}

// A consolidated copy beside the shards is ignored: the index names which files hold the weights.
TEST(Checkpoint, DuplicateFilesFilteredByTheIndex) {
  TempDir d;
  copy_dir(fixture_dir(kSharded), d.str());
  std::vector<std::pair<std::string, Tensor>> all;
  std::vector<std::unique_ptr<SafetensorsFile>> keep;
  const Checkpoint before(d.str());
  for (const auto& p : before.shard_paths()) {
    keep.push_back(std::make_unique<SafetensorsFile>(p, true));
    for (const auto& e : keep.back()->header().entries)
      all.emplace_back(e.name, keep.back()->tensor(e));
  }
  safetensors_write(d.file("consolidated.safetensors"), all);
  Checkpoint c(d.str());
  EXPECT_EQ(c.shard_paths().size(), 2u);
  int visits = 0;
  c.read([](const std::string&) { return true; },
         [&](const std::string&, const Tensor&) { ++visits; }, opts(true, 1));
  EXPECT_EQ(visits, 21);
}

TEST(Checkpoint, MissingShardNamedInTheIndex) {
  TempDir d;
  copy_dir(fixture_dir(kSharded), d.str());
  fs::remove(d.file("model-00002-of-00002.safetensors"));
  EXPECT_ERROR_CONTAINS(Checkpoint c(d.str()), "model-00002-of-00002.safetensors", "missing");
}

TEST(Checkpoint, TensorTheIndexPlacesInAShardThatLacksIt) {
  TempDir d;
  copy_dir(fixture_dir(kSharded), d.str());
  std::string index = read_file(d.file("model.safetensors.index.json"));
  const std::string key = "\"model.norm.weight\"";
  ASSERT_NE(index.find(key), std::string::npos);
  index.replace(index.find(key), key.size(),
                "\"model.extra.weight\": \"model-00001-of-00002.safetensors\", " + key);
  write_file(d.file("model.safetensors.index.json"), index);
  Checkpoint c(d.str());
  EXPECT_ERROR_CONTAINS(c.headers(), "model.extra.weight", "model-00001-of-00002.safetensors");
}

TEST(Checkpoint, FolderErrors) {
  EXPECT_ERROR_CONTAINS(Checkpoint c("/nonexistent/model"), "/nonexistent/model", "does not exist");
  TempDir d;
  EXPECT_ERROR_CONTAINS(Checkpoint c(d.str()), "no .safetensors");
  write_file(d.file("model.safetensors.index.json"), "{\"weight_map\": 5}");
  EXPECT_ERROR_CONTAINS(Checkpoint c(d.str()), "weight_map");
}

TEST(Checkpoint, OptionsFromEnvironment) {
  setenv("ATOM_LOADER_NUM_THREADS", "3", 1);
  setenv("ATOM_DISABLE_MMAP", "true", 1);
  CheckpointReadOptions o = checkpoint_options_from_env();
  EXPECT_EQ(o.num_threads, 3);
  EXPECT_FALSE(o.use_mmap);
  unsetenv("ATOM_LOADER_NUM_THREADS");
  unsetenv("ATOM_DISABLE_MMAP");
  o = checkpoint_options_from_env();
  EXPECT_EQ(o.num_threads, 16);
  EXPECT_TRUE(o.use_mmap);
  setenv("ATOM_LOADER_NUM_THREADS", "0", 1);
  EXPECT_ERROR_CONTAINS(checkpoint_options_from_env(), "ATOM_LOADER_NUM_THREADS");
  setenv("ATOM_LOADER_NUM_THREADS", "many", 1);
  EXPECT_ERROR_CONTAINS(checkpoint_options_from_env(), "ATOM_LOADER_NUM_THREADS");
  unsetenv("ATOM_LOADER_NUM_THREADS");
  setenv("ATOM_DISABLE_MMAP", "perhaps", 1);
  EXPECT_ERROR_CONTAINS(checkpoint_options_from_env(), "ATOM_DISABLE_MMAP");
  unsetenv("ATOM_DISABLE_MMAP");
}

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

// Points the index's entries for the second shard at `target` instead.
void redirect_second_shard(const TempDir& d, const std::string& target) {
  std::string index = read_file(d.file("model.safetensors.index.json"));
  const std::string from = "\"model-00002-of-00002.safetensors\"";
  for (size_t at; (at = index.find(from)) != std::string::npos;)
    index.replace(at, from.size(), nlohmann::json(target).dump());
  write_file(d.file("model.safetensors.index.json"), index);
}

// Paths from the index are data from the hub: they must name files inside the model folder.
// Symlinks the user put in the folder are followed wherever they lead.
TEST(Checkpoint, IndexPathsStayInsideTheModelFolder) {
  {
    TempDir d;
    copy_dir(fixture_dir(kSharded), d.str());
    redirect_second_shard(d, "../../../../etc/passwd");
    EXPECT_ERROR_CONTAINS(Checkpoint c(d.str()), "../../../../etc/passwd",
                          "outside the model folder");
  }
  {
    TempDir d;
    copy_dir(fixture_dir(kSharded), d.str());
    redirect_second_shard(d, "/etc/passwd");
    EXPECT_ERROR_CONTAINS(Checkpoint c(d.str()), "/etc/passwd", "not a path relative");
  }
  {
    TempDir d;
    copy_dir(fixture_dir(kSharded), d.str());
    redirect_second_shard(d, "sub/../../x.safetensors");
    EXPECT_ERROR_CONTAINS(Checkpoint c(d.str()), "outside the model folder");
  }
  // Symlinks in the folder that lead out of it (`ln -s /data/weights/*.safetensors mymodel/`):
  // followed, and the tensors read are the shards' own.
  auto all_bytes = [](Checkpoint& c) {
    std::map<std::string, std::string> out;
    c.read([](const std::string&) { return true; },
           [&](const std::string& name, const Tensor& t) {
             out[name].assign(static_cast<const char*>(t.data()), t.nbytes());
           },
           opts(false, 1));
    return out;
  };
  Checkpoint plain(fixture_dir(kSharded));
  const auto want = all_bytes(plain);
  ASSERT_EQ(want.size(), 21u);
  {
    TempDir outside, d;
    copy_dir(fixture_dir(kSharded), d.str());
    for (const char* shard :
         {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
      fs::rename(d.file(shard), outside.file(shard));
      fs::create_symlink(outside.file(shard), d.file(shard));
    }
    Checkpoint c(d.str());
    EXPECT_EQ(all_bytes(c), want);
  }
  {
    TempDir outside, d;  // no index: the folder's own *.safetensors, a symlink to a folder too
    fs::copy_file(fixture_dir("llama3_gqa") + "/config.json", d.file("config.json"));
    fs::copy_file(fixture_dir("llama3_gqa") + "/model.safetensors", outside.file("m.safetensors"));
    fs::create_symlink(outside.file("m.safetensors"), d.file("model.safetensors"));
    Checkpoint c(d.str());
    Checkpoint direct(fixture_dir("llama3_gqa"));
    EXPECT_EQ(all_bytes(c), all_bytes(direct));
  }
  {
    TempDir d;  // a dangling symlink, or one to a folder: an error naming the shard
    copy_dir(fixture_dir(kSharded), d.str());
    fs::remove(d.file("model-00002-of-00002.safetensors"));
    fs::create_symlink(d.file("gone.safetensors"), d.file("model-00002-of-00002.safetensors"));
    EXPECT_ERROR_CONTAINS(Checkpoint c(d.str()), "model-00002-of-00002.safetensors");
    fs::remove(d.file("model-00002-of-00002.safetensors"));
    fs::create_directories(d.file("dir"));
    fs::create_symlink(d.file("dir"), d.file("model-00002-of-00002.safetensors"));
    EXPECT_ERROR_CONTAINS(Checkpoint c(d.str()), "model-00002-of-00002.safetensors",
                          "not a regular file");
  }
  {
    // Symlinks that stay inside are fine, and so is the Hugging Face cache's layout
    // (snapshots/<rev>/<file> -> ../../blobs/<hash>).
    TempDir repo;
    fs::create_directories(repo.path() / "blobs");
    fs::create_directories(repo.path() / "snapshots" / "abc");
    const fs::path snap = repo.path() / "snapshots" / "abc";
    for (const auto& e : fs::directory_iterator(fixture_dir(kSharded))) {
      const std::string name = e.path().filename().string();
      fs::copy_file(e.path(), repo.path() / "blobs" / ("hash-" + name));
      fs::create_symlink("../../blobs/hash-" + name, snap / name);
    }
    Checkpoint c(snap.string());
    int n = 0;
    c.read([](const std::string&) { return true; }, [&](const std::string&, const Tensor&) { ++n; },
           opts(false, 1));
    EXPECT_EQ(n, 21);
  }
}

}  // namespace
}  // namespace atom::test
