// Errors: user-facing failures are kvtier::Error exceptions carrying a kind and a precise message,
// caught at the CLI/server edge. Internal invariants use KVTIER_ASSERT, which is always on.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kvtier {

enum class ErrorKind {
  kInvalidArgument,  // a bad flag or option value
  kInvalidFile,      // a malformed or unsupported input file
  kUnsupported,      // valid input that this build cannot handle (architecture, type)
  kIo,               // the operating system refused a read, write, map, ...
  kBudget,           // a memory or disk budget cannot be met
  kInterrupted,      // the user asked to stop (Ctrl-C, SIGTERM)
  kInternal,
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message) : std::runtime_error(std::move(message)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(kind, fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void assert_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace kvtier

// Always-on invariant check for bugs (never for validating user input).
#define KVTIER_ASSERT(cond, ...)                                                                  \
  do {                                                                                            \
    if (!(cond)) ::kvtier::assert_failed(#cond, __FILE__, __LINE__, fmt::format("" __VA_ARGS__)); \
  } while (0)
