// Small helpers of the CLI: interruption (Ctrl-C) and progress lines on a terminal.
#pragma once

#include <cstdint>
#include <string>

namespace kvtier::cli {

// Installs SIGINT/SIGTERM handlers that only record the request; long work polls it.
void install_interrupt_handlers();
bool interrupted();
// Throws Error(kIo)-style "interrupted" if a stop was requested.
void throw_if_interrupted();

bool stderr_is_tty();
std::string human_bytes(uint64_t bytes);

}  // namespace kvtier::cli
