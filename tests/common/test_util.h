// Small helpers shared by tests: temporary folders, raw file writing, error-text matching.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "core/error.h"

namespace atom::test {

// A fresh folder removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("atom_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Copies every file of `from` into `to` (flat folders).
inline void copy_dir(const std::string& from, const std::string& to) {
  std::filesystem::create_directories(to);
  for (const auto& e : std::filesystem::directory_iterator(from))
    std::filesystem::copy_file(e.path(), std::filesystem::path(to) / e.path().filename(),
                               std::filesystem::copy_options::overwrite_existing);
}

}  // namespace atom::test

// Expects `stmt` to throw atom::Error whose message contains every one of the given fragments.
#define EXPECT_ERROR_CONTAINS(stmt, ...)                                              \
  do {                                                                                \
    bool atom_thrown_ = false;                                                        \
    try {                                                                             \
      stmt;                                                                           \
    } catch (const ::atom::Error& e) {                                                \
      atom_thrown_ = true;                                                            \
      const std::string atom_msg_ = e.what();                                         \
      for (const std::string& frag : std::initializer_list<std::string>{__VA_ARGS__}) \
        EXPECT_NE(atom_msg_.find(frag), std::string::npos)                            \
            << "error message lacks '" << frag << "':\n  " << atom_msg_;              \
    }                                                                                 \
    EXPECT_TRUE(atom_thrown_) << "expected an atom::Error from " #stmt;               \
  } while (0)
