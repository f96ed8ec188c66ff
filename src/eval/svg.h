// Hand-written SVG plots for the report: a needle heatmap (length x depth, as in the NIAH figures
// of the papers) and lines of a value against context length, one per policy.
#pragma once

#include <string>
#include <vector>

namespace kvtier::eval {

struct Heatmap {
  std::string title;
  std::vector<std::string> x_labels;        // context lengths
  std::vector<std::string> y_labels;        // depths, top to bottom
  std::vector<std::vector<double>> values;  // [y][x] in [0, 1]; NaN: not run
};

struct Series {
  std::string name;
  std::vector<double> y;  // one per x label; NaN: missing
};

struct LinePlot {
  std::string title;
  std::string y_label;
  std::vector<std::string> x_labels;  // equally spaced (lengths double)
  std::vector<Series> series;
  bool unit_range = true;  // y from 0 to 1 shown as percent; else the data's range
};

std::string heatmap_svg(const Heatmap& h);
std::string line_plot_svg(const LinePlot& p);
// Escapes &, <, >, " for XML text and attributes.
std::string xml_escape(const std::string& s);

}  // namespace kvtier::eval
