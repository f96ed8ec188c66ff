#include "cli_util.h"

#include <unistd.h>

#include <csignal>

#include <fmt/format.h>

#include "core/error.h"

namespace kvtier::cli {
namespace {
// The one piece of process-wide state: set from a signal handler, read by long-running loops.
volatile std::sig_atomic_t g_stop_requested = 0;
extern "C" void on_signal(int) {
  g_stop_requested = 1;
}
}  // namespace

void install_interrupt_handlers() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

bool interrupted() {
  return g_stop_requested != 0;
}

void throw_if_interrupted() {
  if (interrupted()) fail(ErrorKind::kIo, "interrupted");
}

bool stderr_is_tty() {
  return ::isatty(2) != 0;
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

}  // namespace kvtier::cli
