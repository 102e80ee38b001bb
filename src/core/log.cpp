#include "core/log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "core/env.h"

namespace atom {

LogLevel log_level() {
  static const LogLevel level = [] {
    const std::string s = env_str("ATOM_LOG_LEVEL", "info");
    if (s == "debug") return LogLevel::kDebug;
    if (s == "warn") return LogLevel::kWarn;
    if (s == "error") return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}

void log_write(LogLevel level, const std::string& msg) {
  static std::mutex mu;
  static const char* names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[atom %02d:%02d:%02d.%03d %s] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec, ms,
               names[static_cast<int>(level)], msg.c_str());
}

}  // namespace atom
