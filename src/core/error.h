// Errors. atom::Error carries a user-facing message (what is wrong and where: file, tensor, field,
// request parameter). ATOM_CHECK guards invariants and adds file and line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace atom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// fail("tensor {} has shape {}", name, shape): throws an Error with the formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace atom

#define ATOM_CHECK(cond, ...)                                                                   \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      throw ::atom::Error(fmt::format("{}:{}: check failed: {}: {}", __FILE__, __LINE__, #cond, \
                                      fmt::format(__VA_ARGS__)));                               \
    }                                                                                           \
  } while (0)
