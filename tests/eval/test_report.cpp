// Report and JSON writing from hand-made results.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_file.h"
#include "core/error.h"
#include "eval/json_out.h"
#include "eval/report.h"
#include "eval/svg.h"

namespace kvtier::eval {
namespace {

RunInfo info() {
  RunInfo i;
  i.model = "models/m.gguf";
  i.model_name = "M";
  i.policies = {"resident", "layer"};
  i.tasks = {TaskKind::kNiah, TaskKind::kVt, TaskKind::kPpl};
  i.lengths = {1024, 2048};
  i.depths = {0.0, 1.0};
  i.samples = 1;
  i.seed = 5;
  return i;
}

Results results() {
  Results r;
  for (const std::string policy : {"resident", "layer"}) {
    for (int64_t len : {1024, 2048}) {
      for (int d = 0; d < 2; ++d) {
        SampleResult s;
        s.policy = policy;
        s.task = TaskKind::kNiah;
        s.length = len;
        s.depth_index = d;
        s.depth = d;
        s.expected = {"1234567"};
        s.answer = len == 1024 ? " 1234567." : " <no> & \"idea\"";
        s.score = len == 1024 ? 1.0 : 0.0;
        r.add(s);
      }
      SampleResult v;
      v.policy = policy;
      v.task = TaskKind::kVt;
      v.length = len;
      v.score = 0.6;
      r.add(v);
      SampleResult p;
      p.policy = policy;
      p.task = TaskKind::kPpl;
      p.length = len;
      p.nll_sum = 10.0;
      p.n_scored = 5;
      r.add(p);
    }
  }
  return r;
}

size_t count(const std::string& s, const std::string& sub) {
  size_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + 1)) ++n;
  return n;
}

TEST(Report, FilesTablesAndPlots) {
  const auto files = report_files(info(), results());
  ASSERT_TRUE(files.count("README.md"));
  EXPECT_TRUE(files.count("niah-resident-heatmap.svg"));
  EXPECT_TRUE(files.count("niah-layer-heatmap.svg"));
  EXPECT_TRUE(files.count("niah-by-length.svg"));
  EXPECT_TRUE(files.count("vt-by-length.svg"));
  EXPECT_TRUE(files.count("ppl-by-length.svg"));
  EXPECT_FALSE(files.count("vt-resident-heatmap.svg"));  // no depth axis
  const std::string& md = files.at("README.md");
  EXPECT_NE(md.find("| resident | 100.0 | 0.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| layer | 60.0 | 60.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| resident | 7.389 | 7.389 |"), std::string::npos) << md;  // exp(10 / 5)
  EXPECT_NE(md.find("| 100% | 100.0 | 0.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("![niah resident heatmap](niah-resident-heatmap.svg)"), std::string::npos);
  for (const auto& [name, svg] : files) {
    if (name.ends_with(".svg")) {
      EXPECT_TRUE(svg.starts_with("<svg ")) << name;
      EXPECT_TRUE(svg.ends_with("</svg>\n")) << name;
      EXPECT_EQ(count(svg, "<text"), count(svg, "</text>")) << name;
    }
  }
  // A heatmap has one cell per (length, depth) plus the background and the colour scale.
  EXPECT_EQ(count(files.at("niah-resident-heatmap.svg"), "<rect"), 1u + 4u + 20u);
  EXPECT_EQ(count(files.at("niah-by-length.svg"), "<polyline"), 2u);
  EXPECT_NE(task_markdown(info(), results(), TaskKind::kNiah, "accuracy/")
                .find("](accuracy/niah-resident-heatmap.svg)"),
            std::string::npos);
}

// Every number after `key="` in the SVG.
std::vector<double> attr_values(const std::string& svg, const std::string& key) {
  std::vector<double> v;
  const std::string k = " " + key + "=\"";
  for (size_t p = svg.find(k); p != std::string::npos; p = svg.find(k, p + 1))
    v.push_back(std::stod(svg.substr(p + k.size())));
  return v;
}

TEST(Report, HeatmapWithOneRowFitsItsCanvas) {
  // One depth and a long model name: the colour scale, its labels and the title stay inside.
  Heatmap h;
  h.title = "passkey: gemma-3-270m-q4_k_m-with-a-long-name (resident)";
  h.x_labels = {"8k"};
  h.y_labels = {"50%"};
  h.values = {{1.0}};
  const std::string svg = heatmap_svg(h);
  const double width = attr_values(svg, "width").at(0), height = attr_values(svg, "height").at(0);
  for (double y : attr_values(svg, "y")) EXPECT_LE(y, height) << svg;  // text baselines and rect tops
  size_t rect = 0;
  for (size_t p = svg.find("<rect x="); p != std::string::npos; p = svg.find("<rect x=", p + 1), ++rect) {
    const std::string r = svg.substr(p, svg.find('>', p) - p);
    EXPECT_LE(attr_values(r, "y").at(0) + attr_values(r, "height").at(0), height + 1.0) << r;
  }
  EXPECT_EQ(rect, 1u + 20u);
  // About 10.5 px per character of the 15 px bold title.
  EXPECT_GE(width, 10.5 * static_cast<double>(h.title.size()));
}

TEST(Report, XmlEscape) {
  EXPECT_EQ(xml_escape("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
}

TEST(Report, JsonHasSamplesCellsAndMeta) {
  const auto j = results_json(info(), results());
  EXPECT_EQ(j["meta"]["model_name"], "M");
  EXPECT_EQ(j["meta"]["tasks"].size(), 3u);
  EXPECT_EQ(j["samples"].size(), 2u * 2 * 4);
  const auto& s0 = j["samples"][0];
  EXPECT_EQ(s0["task"], "niah");
  EXPECT_EQ(s0["expected"][0], "1234567");
  EXPECT_EQ(s0["answer"], " 1234567.");
  EXPECT_EQ(s0["score"], 1.0);
  EXPECT_EQ(j["cells"].size(), 2u * 2 * 2);
  EXPECT_EQ(j["overall"].size(), 2u * 3);
  bool saw_ppl = false;
  for (const auto& c : j["overall"]) {
    if (c["task"] == "ppl") {
      EXPECT_NEAR(c["perplexity"].get<double>(), 7.389056, 1e-5);
      saw_ppl = true;
    }
  }
  EXPECT_TRUE(saw_ppl);
}

TEST(Report, JsonReadsBack) {
  const RunRecord run = run_from_json(results_json(info(), results()));
  EXPECT_EQ(run.info.model_name, "M");
  EXPECT_EQ(run.info.tasks, info().tasks);
  EXPECT_EQ(run.info.depths, info().depths);
  const Results expected = results();  // held: the samples below refer into it
  ASSERT_EQ(run.results.samples().size(), expected.samples().size());
  for (size_t k = 0; k < run.results.samples().size(); ++k) {
    const SampleResult &a = run.results.samples()[k], &b = expected.samples()[k];
    EXPECT_EQ(a.task, b.task);
    EXPECT_EQ(a.depth_index, b.depth_index);
    EXPECT_EQ(a.answer, b.answer);
    EXPECT_EQ(a.nll_sum, b.nll_sum);
  }
  // Same tables from the read-back run.
  EXPECT_EQ(report_files(run.info, run.results).at("README.md"),
            report_files(info(), results()).at("README.md"));
}

TEST(Report, MergesRunsOfOneGrid) {
  // Two parts of a grid: lengths 1k (depths 0, 1) and 4k (depth 0.5, two samples).
  RunInfo i1 = info(), i2 = info();
  i1.policies = i2.policies = {"resident"};
  i1.tasks = i2.tasks = {TaskKind::kNiah};
  i1.lengths = {1024};
  i2.lengths = {4096};
  i2.depths = {0.5};
  i2.samples = 2;
  i1.command = "eval a";
  i2.command = "eval b";
  i1.seconds = 10;
  i2.seconds = 20;
  Results r1, r2;
  for (int d = 0; d < 2; ++d) {
    SampleResult s;
    s.policy = "resident";
    s.length = 1024;
    s.depth_index = d;
    s.depth = d;
    s.seed = 10 + d;
    s.expected = {"1"};
    s.answer = " 1";
    s.score = 1.0;
    r1.add(s);
  }
  for (int k = 0; k < 2; ++k) {
    SampleResult s;
    s.policy = "resident";
    s.length = 4096;
    s.depth_index = 0;
    s.depth = 0.5;
    s.index = k;
    s.seed = 20 + k;
    s.expected = {"1"};
    s.answer = k == 0 ? " 1" : " 2";
    s.score = k == 0 ? 1.0 : 0.0;
    r2.add(s);
  }
  const RunRecord a = run_from_json(results_json(i1, r1)), b = run_from_json(results_json(i2, r2));
  const RunRecord m = merge_runs({a, b, a});  // a repeated: its samples are kept once
  EXPECT_EQ(m.info.lengths, (std::vector<int64_t>{1024, 4096}));
  EXPECT_EQ(m.info.depths, (std::vector<double>{0.0, 0.5, 1.0}));
  EXPECT_EQ(m.info.samples, 2);
  EXPECT_EQ(m.info.seconds, 10.0 + 20.0 + 10.0);
  EXPECT_EQ(m.info.command, "eval a`; `eval b");
  ASSERT_EQ(m.results.samples().size(), 4u);
  EXPECT_EQ(m.results.samples()[1].depth_index, 2);  // depth 1 is the third of the merged depths
  EXPECT_EQ(m.results.samples()[2].depth_index, 1);
  const std::string md = report_files(m.info, m.results).at("README.md");
  EXPECT_NE(md.find("1-2 sample(s) per cell"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0% | 100.0 | - |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 50% | - | 50.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 100% | 100.0 | - |"), std::string::npos) << md;
  // The same sample with another answer is an error (runs are deterministic), as are other models.
  Results changed;
  for (SampleResult s : r1.samples()) {
    s.answer = " 3";
    changed.add(s);
  }
  EXPECT_THROW(merge_runs({a, run_from_json(results_json(i1, changed))}), Error);
  RunInfo other = i2;
  other.model_name = "N";
  EXPECT_THROW(merge_runs({a, run_from_json(results_json(other, r2))}), Error);
  EXPECT_THROW(run_from_json(nlohmann::json{{"meta", 1}}), Error);
}

TEST(Report, WritesDirectory) {
  const ::kvtier::test::TempFile tmp("kvtier_eval_report_test", "");
  const auto& dir = tmp.path();
  write_report(dir.string(), info(), results());
  EXPECT_TRUE(std::filesystem::exists(dir / "README.md"));
  EXPECT_TRUE(std::filesystem::exists(dir / "niah-layer-heatmap.svg"));
  write_json_file((dir / "r.json").string(), results_json(info(), results()));
  std::ifstream in(dir / "r.json");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("\"answer\": \" <no> & \\\"idea\\\"\""), std::string::npos);
}

}  // namespace
}  // namespace kvtier::eval
