#include "cli_util.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "commands.h"
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
  if (interrupted()) fail(ErrorKind::kInterrupted, "interrupted");
}

std::optional<double> whole_number(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size()) return std::nullopt;
  return v;
}

namespace {

// A validator of numbers: ok(v), else "WANT, not TEXT".
CLI::Validator number_check(bool (*ok)(double), const char* want, const char* name) {
  return CLI::Validator(
      [ok, want](std::string& text) -> std::string {
        const std::optional<double> v = whole_number(text);
        if (!v) return fmt::format("'{}' is not a number", text);
        return ok(*v) ? std::string{} : fmt::format("{}, not {}", want, text);
      },
      name);
}

}  // namespace

CLI::Validator positive() {
  return number_check([](double v) { return v > 0; }, "must be greater than 0", "POSITIVE");
}

CLI::Validator non_negative() {
  return number_check([](double v) { return v >= 0; }, "must be 0 or more", "NONNEGATIVE");
}

CLI::Validator output_file() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::filesystem::path dir = std::filesystem::path(text).parent_path();
        std::error_code ec;
        if (text.empty() || std::filesystem::is_directory(text, ec))
          return fmt::format("'{}' is not a file name", text);
        if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
          return fmt::format("the directory '{}' does not exist", dir.string());
        return {};
      },
      "FILE");
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

namespace {

// Splits "1.5GiB" into 1.5 and "GiB"; throws on anything that is not a non-negative number + suffix.
std::pair<double, std::string> number_and_suffix(const std::string& text, const std::string& flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    fail(ErrorKind::kInvalidArgument, "{}: '{}' is not a number", flag, text);
  }
  if (!(v >= 0) || !std::isfinite(v))
    fail(ErrorKind::kInvalidArgument, "{}: '{}' must be non-negative", flag, text);
  std::string suffix = text.substr(used);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return {v, suffix};
}

uint64_t scaled(double v, double scale, const std::string& text, const std::string& flag) {
  const double r = std::round(v * scale);
  if (r > 1.8e19) fail(ErrorKind::kInvalidArgument, "{}: '{}' is too large", flag, text);
  return static_cast<uint64_t>(r);
}

}  // namespace

uint64_t parse_bytes(const std::string& text, const std::string& flag) {
  auto [v, suf] = number_and_suffix(text, flag);
  const double k = 1024.0;
  if (suf.empty() || suf == "B") return scaled(v, 1, text, flag);
  if (suf == "K" || suf == "KIB") return scaled(v, k, text, flag);
  if (suf == "M" || suf == "MIB") return scaled(v, k * k, text, flag);
  if (suf == "G" || suf == "GIB") return scaled(v, k * k * k, text, flag);
  if (suf == "T" || suf == "TIB") return scaled(v, k * k * k * k, text, flag);
  if (suf == "KB") return scaled(v, 1e3, text, flag);
  if (suf == "MB") return scaled(v, 1e6, text, flag);
  if (suf == "GB") return scaled(v, 1e9, text, flag);
  if (suf == "TB") return scaled(v, 1e12, text, flag);
  fail(ErrorKind::kInvalidArgument,
       "{}: unknown size suffix in '{}' (use B, K/KiB, M/MiB, G/GiB, T/TiB, KB, MB, GB)", flag, text);
}

uint64_t parse_tokens(const std::string& text, const std::string& flag) {
  auto [v, suf] = number_and_suffix(text, flag);
  if (suf.empty()) return scaled(v, 1, text, flag);
  if (suf == "K") return scaled(v, 1024, text, flag);
  if (suf == "M") return scaled(v, 1024.0 * 1024, text, flag);
  fail(ErrorKind::kInvalidArgument, "{}: unknown suffix in '{}' (use K = 1024 or M = 1024^2 tokens)", flag,
       text);
}

std::optional<cpu::Isa> isa_flag(const std::string& text) {
  if (text.empty()) return std::nullopt;
  const std::optional<cpu::Isa> isa = cpu::isa_from_name(text);
  if (!isa) fail(ErrorKind::kInvalidArgument, "--isa {}: not a kernel path (scalar, avx2 or avx512)", text);
  cpu::require_isa(*isa);
  return isa;
}

}  // namespace kvtier::cli
