// Thread-local scratch buffers keep their capacity from call to call (that is their point), but
// not the size of one huge input: a server tokenizes on hundreds of handler threads, and each
// would otherwise keep the memory of the largest prompt it ever saw (issue 22: RSS grew by a GB
// per rejected 30 MB prompt and never came back). Past a small size the storage is given back.
#pragma once

#include <string>
#include <tuple>
#include <vector>

namespace atom::tokenizer {

template <typename T>
void release_if_large(std::vector<T>& v, size_t keep_bytes = 64u << 10) {
  if (v.capacity() * sizeof(T) > keep_bytes) std::vector<T>().swap(v);
}

inline void release_if_large(std::string& s, size_t keep_bytes = 64u << 10) {
  if (s.capacity() > keep_bytes) std::string().swap(s);
}

// Releases the given scratch buffers when they are large on leaving the scope (errors included).
template <typename... T>
class ReleaseOnExit {
 public:
  explicit ReleaseOnExit(T&... scratch) : scratch_(scratch...) {}
  ~ReleaseOnExit() {
    std::apply([](auto&... s) { (release_if_large(s), ...); }, scratch_);
  }
  ReleaseOnExit(const ReleaseOnExit&) = delete;
  ReleaseOnExit& operator=(const ReleaseOnExit&) = delete;

 private:
  std::tuple<T&...> scratch_;
};

}  // namespace atom::tokenizer
