#include "eval/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "eval/svg.h"

namespace kvtier::eval {
namespace {

std::string length_label(int64_t len) {
  return len % 1024 == 0 ? fmt::format("{}k", len / 1024) : fmt::format("{}", len);
}

std::string value_text(TaskKind t, double v) {
  if (!std::isfinite(v)) return "-";
  return t == TaskKind::kPpl ? fmt::format("{:.3f}", v) : fmt::format("{:.1f}", v * 100);
}

std::string heatmap_file(TaskKind t, const std::string& policy) {
  return fmt::format("{}-{}-heatmap.svg", task_name(t), policy);
}
std::string lines_file(TaskKind t) {
  return fmt::format("{}-by-length.svg", task_name(t));
}

bool ran(const Results& r, TaskKind t) {
  for (const auto& s : r.samples()) {
    if (s.task == t) return true;
  }
  return false;
}

const Cell* find_cell(const std::vector<Cell>& cells, const std::string& policy, TaskKind t, int64_t len,
                      int depth_index) {
  for (const Cell& c : cells) {
    if (c.policy == policy && c.task == t && c.length == len && c.depth_index == depth_index) return &c;
  }
  return nullptr;
}

double cell_value(const Cell* c) {
  return c ? c->value : NAN;
}

Heatmap make_heatmap(const RunInfo& info, const Results& r, TaskKind t, const std::string& policy) {
  const auto cells = r.depth_cells();
  Heatmap h;
  h.title = fmt::format("{}: {} ({})", task_name(t), info.model_name, policy);
  for (int64_t len : info.lengths) h.x_labels.push_back(length_label(len));
  for (size_t d = 0; d < info.depths.size(); ++d) {
    h.y_labels.push_back(fmt::format("{:.0f}%", info.depths[d] * 100));
    std::vector<double> row;
    for (int64_t len : info.lengths)
      row.push_back(cell_value(find_cell(cells, policy, t, len, static_cast<int>(d))));
    h.values.push_back(std::move(row));
  }
  return h;
}

LinePlot make_lines(const RunInfo& info, const Results& r, TaskKind t) {
  const auto cells = r.length_cells();
  LinePlot p;
  p.title = fmt::format("{}: {}", task_name(t), info.model_name);
  p.unit_range = t != TaskKind::kPpl;
  p.y_label = t == TaskKind::kPpl ? "perplexity" : "accuracy";
  for (int64_t len : info.lengths) p.x_labels.push_back(length_label(len));
  for (const std::string& policy : info.policies) {
    Series se{policy, {}};
    for (int64_t len : info.lengths) se.y.push_back(cell_value(find_cell(cells, policy, t, len, -1)));
    p.series.push_back(std::move(se));
  }
  return p;
}

}  // namespace

std::string task_markdown(const RunInfo& info, const Results& r, TaskKind t, const std::string& plot_dir) {
  std::string md = fmt::format("### {}\n\n", task_name(t));
  const auto by_len = r.length_cells();
  // Samples per cell as run (merged runs may differ from cell to cell).
  int n_min = 0, n_max = 0;
  for (const Cell& c : task_has_depth(t) ? r.depth_cells() : by_len) {
    if (c.task != t) continue;
    n_min = n_max == 0 ? c.n : std::min(n_min, c.n);
    n_max = std::max(n_max, c.n);
  }
  const std::string n_text = n_min == n_max ? fmt::format("{}", n_max) : fmt::format("{}-{}", n_min, n_max);
  md += fmt::format(
      "Scoring: {}. {} per cell; max {} new tokens.\n\n", task_scoring(t),
      t == TaskKind::kPpl ? fmt::format("{} window(s)", n_text) : fmt::format("{} sample(s)", n_text),
      task_max_new_tokens(t));
  md += t == TaskKind::kPpl ? "| policy |" : "| policy (accuracy %) |";
  std::string rule = "|---|";
  for (int64_t len : info.lengths) {
    md += fmt::format(" {} |", length_label(len));
    rule += "---:|";
  }
  md += "\n" + rule + "\n";
  for (const std::string& policy : info.policies) {
    md += fmt::format("| {} |", policy);
    for (int64_t len : info.lengths)
      md += fmt::format(" {} |", value_text(t, cell_value(find_cell(by_len, policy, t, len, -1))));
    md += "\n";
  }
  md += "\n";
  if (task_has_depth(t)) {
    const auto cells = r.depth_cells();
    for (const std::string& policy : info.policies) {
      md += fmt::format("{} by depth (rows) and length (columns), accuracy %:\n\n| depth |", policy);
      for (int64_t len : info.lengths) md += fmt::format(" {} |", length_label(len));
      md += "\n" + rule + "\n";
      for (size_t d = 0; d < info.depths.size(); ++d) {
        md += fmt::format("| {:.0f}% |", info.depths[d] * 100);
        for (int64_t len : info.lengths)
          md += fmt::format(" {} |",
                            value_text(t, cell_value(find_cell(cells, policy, t, len, static_cast<int>(d)))));
        md += "\n";
      }
      md += fmt::format("\n![{} {} heatmap]({}{})\n\n", task_name(t), policy, plot_dir,
                        heatmap_file(t, policy));
    }
  }
  md += fmt::format("![{} by length]({}{})\n\n", task_name(t), plot_dir, lines_file(t));
  return md;
}

std::map<std::string, std::string> report_files(const RunInfo& info, const Results& r) {
  std::map<std::string, std::string> files;
  std::string md = fmt::format("# kvtier eval: {}\n\n", info.model_name);
  md += fmt::format(
      "- command: `{}`\n- model: `{}`\n- policies: {}\n- commit: {}\n- machine: {}\n- started: {}, "
      "took {:.0f} s\n- seed: {}\n- haystack: {}\n\n",
      info.command, info.model, fmt::join(info.policies, ", "), info.commit, info.machine, info.started,
      info.seconds, info.seed, info.haystack);
  for (TaskKind t : info.tasks) {
    if (!ran(r, t)) continue;
    md += task_markdown(info, r, t, "");
    if (task_has_depth(t)) {
      for (const std::string& policy : info.policies)
        files[heatmap_file(t, policy)] = heatmap_svg(make_heatmap(info, r, t, policy));
    }
    files[lines_file(t)] = line_plot_svg(make_lines(info, r, t));
  }
  files["README.md"] = md;
  return files;
}

void write_report(const std::string& dir, const RunInfo& info, const Results& r) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail(ErrorKind::kIo, "cannot create report directory '{}': {}", dir, ec.message());
  for (const auto& [name, content] : report_files(info, r)) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream out(path, std::ios::binary);
    out << content;
    if (!out) fail(ErrorKind::kIo, "cannot write '{}'", path);
  }
}

}  // namespace kvtier::eval
