#include "eval_common.h"

#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>

#include "cli_util.h"
#include "core/error.h"
#include "tokenizer/prompt_tokens.h"

namespace kvtier::cli {
namespace {

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[256];
  while (fgets(buf, sizeof buf, f)) out += buf;
  pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<int64_t> parse_lengths(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  for (const std::string& item : split_commas(s)) {
    std::string digits = item;
    int64_t mult = 1;
    if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) {
      mult = 1024;
      digits.pop_back();
    }
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(digits, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != digits.size() || v <= 0)
      fail(ErrorKind::kInvalidArgument, "{}: '{}' is not a length (e.g. 512, 4k)", flag, item);
    out.push_back(v * mult);
  }
  return out;
}

std::vector<double> parse_depths(const std::string& s) {
  std::vector<double> out;
  for (const std::string& item : split_commas(s)) {
    const std::optional<double> v = whole_number(item);
    if (!v || !(*v >= 0.0 && *v <= 1.0))
      fail(ErrorKind::kInvalidArgument, "--depths: '{}' is not a depth in [0, 1]", item);
    out.push_back(*v);
  }
  return out;
}

std::vector<int32_t> eval_prompt_tokens(const runtime::LoadedModel& model,
                                        const std::optional<tokenizer::ChatTemplate>& tmpl,
                                        const eval::Prompt& p) {
  return tokenizer::one_turn_prompt_tokens(*model.tokenizer, tmpl, p.user, p.answer_prefix);
}

std::string source_commit() {
  const std::string c =
      run_capture(fmt::format("git -C '{}' describe --always --dirty 2>/dev/null", KVTIER_SOURCE_DIR));
  return c.empty() ? "unknown" : c;
}

std::string machine_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, cpu = "unknown CPU";
  while (std::getline(in, line)) {
    if (line.starts_with("model name")) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return fmt::format("{}, {} hardware threads", cpu, std::thread::hardware_concurrency());
}

std::string now_iso() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string duration_text(double s) {
  if (s < 0) return "?";
  const auto total = static_cast<int64_t>(s + 0.5);
  return total >= 60 ? fmt::format("{}m{:02d}s", total / 60, total % 60) : fmt::format("{}s", total);
}

}  // namespace kvtier::cli
