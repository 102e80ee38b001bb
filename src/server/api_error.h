// Errors the HTTP layer turns into vLLM's error envelope:
// {"error": {"message", "type", "param", "code"}} with `code` the HTTP status.
#pragma once

#include <string>

#include "core/error.h"

namespace atom::server {

class ApiError : public Error {
 public:
  ApiError(int status, std::string type, std::string message, std::string param = "")
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string type_;
  std::string param_;
};

// 400 BadRequestError naming the request parameter at fault.
[[noreturn]] inline void bad_request(const std::string& param, const std::string& message) {
  throw ApiError(400, "BadRequestError", message, param);
}

}  // namespace atom::server
