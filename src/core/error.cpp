#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace kvtier {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kInvalidFile:
      return "invalid file";
    case ErrorKind::kUnsupported:
      return "unsupported";
    case ErrorKind::kIo:
      return "I/O error";
    case ErrorKind::kBudget:
      return "budget";
    case ErrorKind::kInterrupted:
      return "interrupted";
    case ErrorKind::kInternal:
      return "internal error";
  }
  return "error";
}

void assert_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "kvtier: internal assertion failed: %s at %s:%d%s%s\n", expr, file, line,
               msg.empty() ? "" : ": ", msg.c_str());
  std::abort();
}

}  // namespace kvtier
