#include "eval/sweep_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "eval/json_out.h"

namespace kvtier::eval {
namespace {

constexpr int kFormat = 1;  // "kvtier_compare" in the header: the line format's version

std::string dump_line(const nlohmann::json& j) {
  // Answers are model text: invalid UTF-8 is replaced rather than throwing.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Budget budget_from_text(const std::string& s) {
  const auto b = parse_budgets(s);
  return b.front();
}

}  // namespace

double CellResult::value() const {
  if (samples.empty()) return NAN;
  if (key.task == TaskKind::kPpl) {
    double nll = 0;
    int64_t n = 0;
    for (const SampleResult& s : samples) nll += s.nll_sum, n += s.n_scored;
    return n > 0 ? std::exp(nll / static_cast<double>(n)) : NAN;
  }
  double sum = 0;
  for (const SampleResult& s : samples) sum += s.score;
  return sum / static_cast<double>(samples.size());
}

nlohmann::json header_json(const SweepHeader& h) {
  return {{"kvtier_compare", kFormat}, {"model", h.model},   {"model_name", h.model_name}, {"seed", h.seed},
          {"samples", h.samples},      {"depths", h.depths}, {"settings", h.settings}};
}

SweepHeader header_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("kvtier_compare"))
    fail(ErrorKind::kInvalidFile, "the first line is not a kvtier compare header");
  if (j.at("kvtier_compare").get<int>() != kFormat)
    fail(ErrorKind::kInvalidFile, "results format {} (this kvtier reads {})", j.at("kvtier_compare").dump(),
         kFormat);
  SweepHeader h;
  h.model = j.at("model").get<std::string>();
  h.model_name = j.at("model_name").get<std::string>();
  h.seed = j.at("seed").get<uint64_t>();
  h.samples = j.at("samples").get<int>();
  h.depths = j.at("depths").get<std::vector<double>>();
  h.settings = j.at("settings");
  return h;
}

nlohmann::json cell_json(const CellResult& c) {
  nlohmann::json samples = nlohmann::json::array();
  for (const SampleResult& s : c.samples) samples.push_back(sample_json(s));
  return {{"task", std::string(task_name(c.key.task))},
          {"length", c.key.length},
          {"policy", c.key.policy},
          {"budget", c.key.budget ? nlohmann::json(c.key.budget->text()) : nlohmann::json(nullptr)},
          {"budget_tokens", c.key.budget_tokens},
          {"kv_bytes", {{"device", c.kv.device}, {"host", c.kv.host}, {"disk", c.kv.disk}}},
          {"bytes_loaded", c.bytes_loaded},
          {"bytes_stored", c.bytes_stored},
          {"prefill", {{"tokens", c.prefill_tokens}, {"seconds", c.prefill_s}}},
          {"decode", {{"tokens", c.decode_tokens}, {"seconds", c.decode_s}}},
          {"seconds", c.seconds},
          {"threads", c.threads},
          {"commit", c.commit},
          {"machine", c.machine},
          {"finished", c.finished},
          {"command", c.command},
          {"samples", samples}};
}

CellResult cell_from_json(const nlohmann::json& j, const std::vector<double>& depths) {
  CellResult c;
  c.key.task = parse_task(j.at("task").get<std::string>());
  c.key.length = j.at("length").get<int64_t>();
  c.key.policy = j.at("policy").get<std::string>();
  if (!j.at("budget").is_null()) c.key.budget = budget_from_text(j.at("budget").get<std::string>());
  c.key.budget_tokens = j.at("budget_tokens").get<int64_t>();
  const auto& kv = j.at("kv_bytes");
  c.kv = {kv.at("device").get<uint64_t>(), kv.at("host").get<uint64_t>(), kv.at("disk").get<uint64_t>()};
  c.bytes_loaded = j.at("bytes_loaded").get<uint64_t>();
  c.bytes_stored = j.at("bytes_stored").get<uint64_t>();
  c.prefill_tokens = j.at("prefill").at("tokens").get<int64_t>();
  c.prefill_s = j.at("prefill").at("seconds").get<double>();
  c.decode_tokens = j.at("decode").at("tokens").get<int64_t>();
  c.decode_s = j.at("decode").at("seconds").get<double>();
  c.seconds = j.at("seconds").get<double>();
  c.threads = j.value("threads", 0);
  c.commit = j.value("commit", "");
  c.machine = j.value("machine", "");
  c.finished = j.value("finished", "");
  c.command = j.value("command", "");
  for (const auto& js : j.at("samples")) c.samples.push_back(sample_from_json(js, depths));
  return c;
}

SweepRecord read_sweep_file(const std::string& path, bool* dropped_tail) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "cannot read '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (dropped_tail) *dropped_tail = !text.empty() && text.back() != '\n';
  SweepRecord rec;
  bool have_header = false;
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // an incomplete last line: a write cut short
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!have_header) {
        rec.header = header_from_json(j);
        have_header = true;
        continue;
      }
      CellResult c = cell_from_json(j, rec.header.depths);
      bool dup = false;
      for (const CellResult& o : rec.cells) dup |= o.key == c.key;
      if (!dup) rec.cells.push_back(std::move(c));  // two processes on one file: the first copy counts
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorKind::kInvalidFile, "{}:{}: not a kvtier compare {} line: {}", path, line_no,
           have_header ? "cell" : "header", e.what());
    } catch (const Error& e) {
      fail(ErrorKind::kInvalidFile, "{}:{}: {}", path, line_no, e.what());
    }
  }
  if (!have_header && !text.empty() && text.find('\n') != std::string::npos)
    fail(ErrorKind::kInvalidFile, "{}: no header line", path);
  return rec;
}

SweepFile::SweepFile(std::string path, const SweepHeader& header) : path_(std::move(path)) {
  std::error_code ec;
  const bool exists = std::filesystem::exists(path_, ec);
  std::string text;
  if (exists) {
    bool torn = false;
    record_ = read_sweep_file(path_, &torn);
    std::ifstream in(path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    if (torn) {
      const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      std::filesystem::resize_file(path_, keep, ec);
      if (ec) fail(ErrorKind::kIo, "cannot cut the incomplete last line of '{}': {}", path_, ec.message());
      text.resize(keep);
      dropped_tail_ = true;
    }
  }
  if (text.empty()) {
    record_ = {header, {}};
    const std::string line = dump_line(header_json(header));
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << line;
    out.close();
    if (!out) fail(ErrorKind::kIo, "cannot write '{}'", path_);
    return;
  }
  const SweepHeader& h = record_.header;
  const auto differs = [&](const char* what, const std::string& file, const std::string& now) {
    fail(ErrorKind::kInvalidArgument,
         "'{}' holds a sweep with {} {}, this run has {}: give the same settings to continue it, or "
         "another --results file",
         path_, what, file, now);
  };
  if (h.model_name != header.model_name) differs("model", h.model_name, header.model_name);
  if (h.seed != header.seed) differs("seed", std::to_string(h.seed), std::to_string(header.seed));
  if (h.samples != header.samples)
    differs("samples", std::to_string(h.samples), std::to_string(header.samples));
  if (h.depths != header.depths)
    differs("depths", nlohmann::json(h.depths).dump(), nlohmann::json(header.depths).dump());
  for (const auto& [k, v] : header.settings.items()) {
    const nlohmann::json old = h.settings.contains(k) ? h.settings.at(k) : nlohmann::json(nullptr);
    if (old != v) differs(k.c_str(), old.dump(), v.dump());
  }
  for (const auto& [k, v] : h.settings.items()) {
    if (!header.settings.contains(k)) differs(k.c_str(), v.dump(), "none");
  }
}

bool SweepFile::has(const CellKey& k) const {
  for (const CellResult& c : record_.cells) {
    if (c.key == k) return true;
  }
  return false;
}

void SweepFile::append(const CellResult& c) {
  const std::string line = dump_line(cell_json(c));
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "cannot open '{}' to append: {}", path_, std::strerror(errno));
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      fail(ErrorKind::kIo, "write to '{}' failed: {}", path_, std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "fsync of '{}' failed: {}", path_, std::strerror(err));
  }
  ::close(fd);
  record_.cells.push_back(c);
}

}  // namespace kvtier::eval
