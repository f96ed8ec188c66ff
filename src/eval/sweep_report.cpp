#include "eval/sweep_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "core/error.h"
#include "eval/svg.h"

namespace kvtier::eval {
namespace {

struct Config {
  std::string name, policy;
  std::optional<Budget> budget;
};

// Configurations are named by their config string.
bool operator==(const Config& a, const Config& b) {
  return a.name == b.name;
}

// The merged cells of one model, indexed.
struct Sweep {
  SweepHeader header;
  std::vector<CellResult> cells;
  std::vector<Config> configs;   // first-seen order, resident first
  std::vector<int64_t> lengths;  // ascending
  // The lengths at which every configuration ran every task (all lengths if there is none): the
  // summary and the accuracy plots pool over these, so that a sweep stopped part-way compares
  // configurations on the same lengths.
  std::vector<int64_t> pooled;
  bool pooled_complete = true;
  std::vector<TaskKind> tasks;  // first-seen order
  std::vector<std::string> commands, commits, machines;
  double seconds = 0.0;

  const CellResult* find(TaskKind t, int64_t len, const std::string& config) const {
    for (const CellResult& c : cells) {
      if (c.key.task == t && c.key.length == len && c.key.config() == config) return &c;
    }
    return nullptr;
  }
  const CellResult* resident(TaskKind t, int64_t len) const { return find(t, len, "resident"); }
};

template <typename T>
void add_unique(std::vector<T>& v, const T& x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

Sweep merge(const std::vector<SweepRecord>& records) {
  if (records.empty()) fail(ErrorKind::kInvalidArgument, "no results to report");
  Sweep s;
  s.header = records.front().header;
  for (const SweepRecord& r : records) {
    if (r.header.model_name != s.header.model_name)
      fail(ErrorKind::kInvalidArgument, "results of different models: {} and {} (one report per model)",
           s.header.model_name, r.header.model_name);
    for (const CellResult& c : r.cells) {
      bool dup = false;
      for (const CellResult& o : s.cells) dup |= o.key == c.key;
      if (dup) continue;
      s.cells.push_back(c);
    }
  }
  add_unique(s.configs, {"resident", "resident", std::nullopt});
  for (const CellResult& c : s.cells) {
    bool seen = false;
    for (const Config& k : s.configs) seen |= k.name == c.key.config();
    if (!seen) s.configs.push_back({c.key.config(), c.key.policy, c.key.budget});
    add_unique(s.lengths, c.key.length);
    add_unique(s.tasks, c.key.task);
    add_unique(s.commands, c.command);
    add_unique(s.commits, c.commit);
    add_unique(s.machines, c.machine);
    s.seconds += c.seconds;
  }
  std::sort(s.lengths.begin(), s.lengths.end());
  for (int64_t len : s.lengths) {
    bool all = true;
    for (const Config& c : s.configs) {
      for (TaskKind t : s.tasks) all = all && s.find(t, len, c.name) != nullptr;
    }
    if (all) s.pooled.push_back(len);
  }
  if (s.pooled.empty()) {
    s.pooled = s.lengths;
    s.pooled_complete = false;
  }
  return s;
}

double score_sum(const CellResult& c) {
  double sum = 0;
  for (const SampleResult& s : c.samples) sum += s.score;
  return sum;
}

uint64_t kv_at(const Sweep& s, int64_t len, const std::string& config) {
  uint64_t m = 0;  // the largest over the tasks (prompts differ in length)
  for (TaskKind t : s.tasks) {
    if (const CellResult* c = s.find(t, len, config)) m = std::max(m, c->kv.total());
  }
  return m;
}

// KV bytes / resident's at the lengths both ran, mean over those lengths (only `task` if given).
double kv_ratio(const Sweep& s, const std::string& config, std::optional<TaskKind> task = std::nullopt) {
  double sum = 0;
  int n = 0;
  for (int64_t len : s.pooled) {
    if (task && !s.find(*task, len, config)) continue;
    const uint64_t a = kv_at(s, len, config), r = kv_at(s, len, "resident");
    if (a == 0 || r == 0) continue;
    sum += static_cast<double>(a) / static_cast<double>(r);
    ++n;
  }
  return n ? sum / n : NAN;
}

// Pooled relative accuracy of a config on one task over the lengths (ratio of score sums; ppl: mean
// of the per-length ratios).
double pooled_relative(const Sweep& s, const std::string& config, TaskKind t) {
  double a = 0, r = 0, ratio_sum = 0;
  int n = 0;
  for (int64_t len : s.pooled) {
    const CellResult* c = s.find(t, len, config);
    const CellResult* res = s.resident(t, len);
    if (!c || !res) continue;
    if (t == TaskKind::kPpl) {
      const double q = relative_accuracy(*c, *res);
      if (std::isfinite(q)) ratio_sum += q, ++n;
    } else {
      a += score_sum(*c);
      r += score_sum(*res);
      ++n;
    }
  }
  if (t == TaskKind::kPpl) return n ? ratio_sum / n : NAN;
  return n && r > 0 ? a / r : NAN;
}

std::string pct(double v) {
  return std::isfinite(v) ? fmt::format("{:.1f}", v * 100) : "-";
}
std::string percent(double v) {
  return std::isfinite(v) ? fmt::format("{:.1f}%", v * 100) : "-";
}
std::string ratio(double v) {
  return std::isfinite(v) ? fmt::format("{:.2f}", v) : "-";
}
std::string bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1ull << 10));
  return fmt::format("{} B", b);
}
struct Speed {
  double pre_tok = 0, pre_s = 0, dec_tok = 0, dec_s = 0;
  double prefill() const { return pre_s > 0 && pre_tok > 0 ? pre_tok / pre_s : NAN; }
  double decode() const { return dec_s > 0 && dec_tok > 0 ? dec_tok / dec_s : NAN; }
};
Speed speed_at(const Sweep& s, int64_t len, const std::string& config) {
  Speed sp;
  for (TaskKind t : s.tasks) {
    if (const CellResult* c = s.find(t, len, config)) {
      sp.pre_tok += static_cast<double>(c->prefill_tokens);
      sp.pre_s += c->prefill_s;
      sp.dec_tok += static_cast<double>(c->decode_tokens);
      sp.dec_s += c->decode_s;
    }
  }
  return sp;
}

std::string speed_text(double v, double ref, bool is_ref) {
  if (!std::isfinite(v)) return "-";
  if (is_ref || !std::isfinite(ref) || ref <= 0) return fmt::format("{:.1f}", v);
  return fmt::format("{:.1f} ({:.2f}x)", v, v / ref);
}

std::string accuracy_plot_file(TaskKind t) {
  return fmt::format("accuracy-vs-compression-{}.svg", task_name(t));
}

std::vector<std::optional<Budget>> budgets_of(const Sweep& s) {
  std::vector<std::optional<Budget>> out;
  for (const Config& c : s.configs) {
    if (c.budget && std::find(out.begin(), out.end(), c.budget) == out.end()) out.push_back(c.budget);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->value() > b->value(); });
  return out;
}

std::string accuracy_svg(const Sweep& s, TaskKind t) {
  XyPlot p;
  p.title = fmt::format("{}: accuracy vs KV memory, {} ({})", task_name(t), s.header.model_name,
                        s.pooled.size() == 1 ? length_text(s.pooled.front())
                                             : fmt::format("{} to {}", length_text(s.pooled.front()),
                                                           length_text(s.pooled.back())));
  p.x_label = "KV bytes held (all tiers) / resident's";
  p.y_label = t == TaskKind::kPpl ? "resident's perplexity / perplexity" : "accuracy relative to resident";
  std::vector<std::string> policies;
  for (const Config& c : s.configs) add_unique(policies, c.policy);
  for (const std::string& pol : policies) {
    XySeries se{pol, {}};
    for (const Config& c : s.configs) {
      if (c.policy != pol) continue;
      se.points.push_back({kv_ratio(s, c.name, t), pooled_relative(s, c.name, t),
                           c.budget ? fmt::format("@{}", c.budget->text()) : ""});
    }
    p.series.push_back(std::move(se));
  }
  return xy_plot_svg(p);
}

std::string speed_svg(const Sweep& s) {
  std::vector<std::optional<Budget>> budgets = budgets_of(s);
  if (budgets.empty()) budgets.push_back(std::nullopt);
  std::vector<Panel> panels;
  for (const auto& b : budgets) {
    for (int metric = 0; metric < 2; ++metric) {
      LinePlot p;
      p.title = fmt::format("{}{}", metric == 0 ? "prefill" : "decode",
                            b ? fmt::format(", budgets at {} of the context", b->text()) : "");
      p.y_label = metric == 0 ? "prefill tokens/s" : "decode tokens/s";
      p.unit_range = false;
      p.y_from_zero = true;
      for (int64_t len : s.lengths) p.x_labels.push_back(length_text(len));
      for (const Config& c : s.configs) {
        if (c.budget && c.budget != b) continue;
        Series se{c.name, {}};
        for (int64_t len : s.lengths) {
          const Speed sp = speed_at(s, len, c.name);
          se.y.push_back(metric == 0 ? sp.prefill() : sp.decode());
        }
        p.series.push_back(std::move(se));
      }
      panels.push_back({line_plot_svg(p), line_plot_width(p), line_plot_height(p)});
    }
  }
  return panels_svg(fmt::format("Speed vs context: {}", s.header.model_name), panels, 2);
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const std::string& x : v) out += (out.empty() ? "" : sep) + x;
  return out;
}

}  // namespace

double relative_accuracy(const CellResult& c, const CellResult& resident) {
  const double a = c.value(), r = resident.value();
  if (!std::isfinite(a) || !std::isfinite(r)) return NAN;
  if (c.key.task == TaskKind::kPpl) return a > 0 ? r / a : NAN;
  return r > 0 ? a / r : NAN;
}

std::vector<ConfigSummary> summarize(const std::vector<CellResult>& cells) {
  const Sweep s = merge({SweepRecord{{}, cells}});
  std::vector<ConfigSummary> out;
  for (const Config& k : s.configs) {
    ConfigSummary row;
    row.config = k.name;
    row.policy = k.policy;
    row.budget = k.budget;
    row.kv_ratio = kv_ratio(s, k.name);
    double a = 0, r = 0;
    int64_t same = 0, compared = 0;
    for (const CellResult& c : s.cells) {
      if (c.key.config() != k.name) continue;
      ++row.cells;
      if (std::find(s.pooled.begin(), s.pooled.end(), c.key.length) == s.pooled.end()) continue;
      const CellResult* res = s.resident(c.key.task, c.key.length);
      if (!res) continue;
      if (c.key.task != TaskKind::kPpl) a += score_sum(c), r += score_sum(*res);
      for (const SampleResult& x : c.samples) {
        for (const SampleResult& y : res->samples) {
          if (x.depth_index != y.depth_index || x.index != y.index) continue;
          ++compared;
          same += x.answer == y.answer && x.nll_sum == y.nll_sum;
        }
      }
    }
    if (r > 0) row.rel_accuracy = a / r;
    if (compared > 0) row.same_answers = static_cast<double>(same) / static_cast<double>(compared);
    out.push_back(row);
  }
  return out;
}

std::string sweep_markdown(const std::vector<SweepRecord>& records, const std::string& plot_dir) {
  const Sweep s = merge(records);
  std::string md;
  md += fmt::format("- model: `{}`\n- command: `{}`\n- commit: {}\n- machine: {}\n", s.header.model,
                    join(s.commands, "`; `"), join(s.commits, ", "), join(s.machines, "; "));
  md += fmt::format(
      "- {} cells, {:.0f} s of runs; seed {}, {} sample(s) per cell and depth{}\n", s.cells.size(), s.seconds,
      s.header.seed, s.header.samples,
      s.header.depths.empty() ? "" : fmt::format(" (depths {})", fmt::join(s.header.depths, ", ")));
  md += fmt::format("- settings: `{}`\n\n", s.header.settings.dump());
  // Holes in the grid the file spans (a sweep stopped part-way).
  std::vector<std::string> missing;
  size_t expected = 0;
  for (int64_t len : s.lengths) {
    for (const Config& c : s.configs) {
      for (TaskKind t : s.tasks) {
        ++expected;
        if (!s.find(t, len, c.name))
          missing.push_back(fmt::format("{} {} {}", task_name(t), length_text(len), c.name));
      }
    }
  }
  if (!missing.empty()) {
    md += fmt::format(
        "**Incomplete**: {} of the {} cells (lengths x configurations x tasks above) have not run: {}{}.\n\n",
        missing.size(), expected,
        join(
            std::vector<std::string>(missing.begin(), missing.begin() + std::min<size_t>(missing.size(), 12)),
            "; "),
        missing.size() > 12 ? "; ..." : "");
  }

  md += "### Summary\n\n";
  std::vector<std::string> pooled_text;
  for (int64_t len : s.pooled) pooled_text.push_back(length_text(len));
  md += fmt::format(
      "Over the lengths {} ({}). Accuracy relative to `resident`: the policy's scores summed over every "
      "task (ppl excluded) and those lengths, divided by resident's on the same cells. Same answers: share "
      "of samples whose answer (ppl: NLL) equals resident's. KV vs resident: KV bytes held on all tiers "
      "(peak, from the memory ledger) over resident's at the same length, mean over those lengths. Speeds "
      "at the longest of them. The per-length tables below show every cell.\n\n",
      join(pooled_text, ", "),
      s.pooled_complete ? "those at which every configuration ran every task"
                        : "no length has every configuration yet: each row pools over the lengths it ran");
  const int64_t longest = s.pooled.empty() ? 0 : s.pooled.back();
  md += fmt::format(
      "| policy | budget | KV vs resident | accuracy vs resident | same answers | prefill tok/s ({0}) | "
      "decode tok/s ({0}) |\n"
      "|---|---|---:|---:|---:|---:|---:|\n",
      length_text(longest));
  const Speed ref = speed_at(s, longest, "resident");
  for (const ConfigSummary& row : summarize(s.cells)) {
    const Speed sp = speed_at(s, longest, row.config);
    const bool is_ref = row.config == "resident";
    md += fmt::format(
        "| {} | {} | {} | {} | {} | {} | {} |\n", row.policy, row.budget ? row.budget->text() : "-",
        std::isfinite(row.kv_ratio) ? fmt::format("{:.3f}", row.kv_ratio) : "-", percent(row.rel_accuracy),
        percent(row.same_answers), speed_text(sp.prefill(), ref.prefill(), is_ref),
        speed_text(sp.decode(), ref.decode(), is_ref));
  }
  md += "\n";

  md += "### Accuracy by task and length\n\n";
  for (TaskKind t : s.tasks) {
    md += fmt::format(
        "#### {}\n\nScoring: {}. Cells: {} (relative to resident in parentheses).\n\n| policy | budget |",
        task_name(t), task_scoring(t), t == TaskKind::kPpl ? "perplexity" : "accuracy %");
    std::string rule = "|---|---|";
    for (int64_t len : s.lengths) md += fmt::format(" {} |", length_text(len)), rule += "---:|";
    md += "\n" + rule + "\n";
    for (const Config& c : s.configs) {
      md += fmt::format("| {} | {} |", c.policy, c.budget ? c.budget->text() : "-");
      for (int64_t len : s.lengths) {
        const CellResult* cell = s.find(t, len, c.name);
        const CellResult* res = s.resident(t, len);
        if (!cell) {
          md += " - |";
          continue;
        }
        const std::string v = t == TaskKind::kPpl ? fmt::format("{:.3f}", cell->value()) : pct(cell->value());
        md += c.name == "resident" || !res
                  ? fmt::format(" {} |", v)
                  : fmt::format(" {} ({}) |", v, ratio(relative_accuracy(*cell, *res)));
      }
      md += "\n";
    }
    md += fmt::format("\n![{} accuracy vs compression]({}{})\n\n", task_name(t), plot_dir,
                      accuracy_plot_file(t));
  }

  md +=
      "### KV memory and bytes moved\n\n"
      "Peak KV bytes per tier (the ledger's KV category: blocks, staging buffers of offloaded KV, home-tier "
      "copies); bytes loaded to and stored from compute-local memory, per sample.\n\n"
      "| length | policy | budget | KV device | KV host | KV disk | KV vs resident | loaded / sample | "
      "stored / sample |\n"
      "|---|---|---|---:|---:|---:|---:|---:|---:|\n";
  for (int64_t len : s.lengths) {
    const uint64_t res_kv = kv_at(s, len, "resident");
    for (const Config& c : s.configs) {
      KvBytes kv;
      uint64_t loaded = 0, stored = 0;
      size_t n = 0;
      bool any = false;
      for (TaskKind t : s.tasks) {
        const CellResult* cell = s.find(t, len, c.name);
        if (!cell) continue;
        any = true;
        kv.device = std::max(kv.device, cell->kv.device);
        kv.host = std::max(kv.host, cell->kv.host);
        kv.disk = std::max(kv.disk, cell->kv.disk);
        loaded += cell->bytes_loaded;
        stored += cell->bytes_stored;
        n += cell->samples.size();
      }
      if (!any) continue;
      const double r =
          res_kv ? static_cast<double>(kv_at(s, len, c.name)) / static_cast<double>(res_kv) : NAN;
      md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", length_text(len), c.policy,
                        c.budget ? c.budget->text() : "-", bytes(kv.device), bytes(kv.host), bytes(kv.disk),
                        std::isfinite(r) ? fmt::format("{:.3f}", r) : "-", bytes(n ? loaded / n : 0),
                        bytes(n ? stored / n : 0));
    }
  }
  md += "\n";

  md +=
      "### Speed\n\n"
      "Tokens per second of the samples' own generation (greedy): prefill = prompt tokens / prefill time, "
      "decode = decoded tokens / decode time, summed over the tasks at each length (ppl windows are not "
      "timed); ratio to resident in parentheses. Answers are short (a few to tens of tokens), so decode "
      "figures are noisier than `kvtier bench`'s.\n\n| policy | budget |";
  std::string rule = "|---|---|";
  for (int64_t len : s.lengths) md += fmt::format(" prefill {} |", length_text(len)), rule += "---:|";
  for (int64_t len : s.lengths) md += fmt::format(" decode {} |", length_text(len)), rule += "---:|";
  md += "\n" + rule + "\n";
  for (const Config& c : s.configs) {
    md += fmt::format("| {} | {} |", c.policy, c.budget ? c.budget->text() : "-");
    for (int metric = 0; metric < 2; ++metric) {
      for (int64_t len : s.lengths) {
        const Speed sp = speed_at(s, len, c.name), r = speed_at(s, len, "resident");
        const std::string v = metric == 0 ? speed_text(sp.prefill(), r.prefill(), c.name == "resident")
                                          : speed_text(sp.decode(), r.decode(), c.name == "resident");
        md += fmt::format(" {} |", v);
      }
    }
    md += "\n";
  }
  md += fmt::format("\n![speed vs context]({}speed-vs-context.svg)\n", plot_dir);
  return md;
}

std::map<std::string, std::string> sweep_report_files(const std::vector<SweepRecord>& records) {
  const Sweep s = merge(records);
  std::map<std::string, std::string> files;
  files["README.md"] =
      fmt::format("# kvtier compare: {}\n\n", s.header.model_name) + sweep_markdown(records, "");
  for (TaskKind t : s.tasks) files[accuracy_plot_file(t)] = accuracy_svg(s, t);
  files["speed-vs-context.svg"] = speed_svg(s);
  return files;
}

void write_sweep_report(const std::string& dir, const std::vector<SweepRecord>& records) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail(ErrorKind::kIo, "cannot create report directory '{}': {}", dir, ec.message());
  for (const auto& [name, content] : sweep_report_files(records)) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream out(path, std::ios::binary);
    out << content;
    if (!out) fail(ErrorKind::kIo, "cannot write '{}'", path);
  }
}

}  // namespace kvtier::eval
