// Small helpers of the CLI: interruption (Ctrl-C) and progress lines on a terminal.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/cpu/cpu_features.h"

namespace kvtier::cli {

// Installs SIGINT/SIGTERM handlers that only record the request; long work polls it.
void install_interrupt_handlers();
bool interrupted();
// Throws Error(kIo)-style "interrupted" if a stop was requested.
void throw_if_interrupted();

// The number `text` spells as a whole ("1.5", "-2", "1e3"), or nothing (empty, trailing characters,
// out of range).
std::optional<double> whole_number(const std::string& text);

bool stderr_is_tty();
std::string human_bytes(uint64_t bytes);
// "24GiB", "512M", "1.5G", "4096" -> bytes (K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; KB/MB/
// GB/TB powers of 1000). Throws Error(kInvalidArgument) naming the flag.
uint64_t parse_bytes(const std::string& text, const std::string& flag);
// "128K", "1M", "4096" -> tokens (K = 1024, M = 1024^2). Throws Error(kInvalidArgument).
uint64_t parse_tokens(const std::string& text, const std::string& flag);
// The CPU kernel path an --isa value names: nothing for "" (the caller's default, the best path),
// else the path, required to run here (cpu::require_isa: a clear kUnsupported error otherwise).
// Throws Error(kInvalidArgument) for a name that is no path (CLI11's IsMember check comes first).
std::optional<cpu::Isa> isa_flag(const std::string& text);

}  // namespace kvtier::cli
