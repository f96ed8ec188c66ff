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
  bool unit_range = true;    // y from 0 to 1 shown as percent; else the data's range
  bool y_from_zero = false;  // with !unit_range: the axis starts at 0 (speeds)
};

// Points (x, y) with a numeric x axis on a log2 scale (compression ratios), each series a policy
// whose points (budgets) are joined in x order and labelled.
struct XyPoint {
  double x = 0, y = 0;
  std::string label;  // drawn beside the marker ("1/8"); may be empty
};
struct XySeries {
  std::string name;
  std::vector<XyPoint> points;
};
struct XyPlot {
  std::string title, x_label, y_label;
  std::vector<XySeries> series;
  double y_min = 0.0;  // y axis from y_min to max(y_max, the data)
  double y_max = 1.0;
  bool y_percent = true;  // y ticks as percent
};

std::string heatmap_svg(const Heatmap& h);
std::string xy_plot_svg(const XyPlot& p);
// The size line_plot_svg gives a plot.
double line_plot_width(const LinePlot& p);
double line_plot_height(const LinePlot& p);
// Plots side by side in one SVG, `columns` per row, under a title; `width`/`height` of each panel.
struct Panel {
  std::string svg;
  double width = 0, height = 0;
};
std::string panels_svg(const std::string& title, const std::vector<Panel>& panels, int columns);
std::string line_plot_svg(const LinePlot& p);
// Escapes &, <, >, " for XML text and attributes.
std::string xml_escape(const std::string& s);

}  // namespace kvtier::eval
