#include "eval/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kvtier::eval {
namespace {

constexpr const char* kFont = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";
// Distinct colours and dash patterns, so that identical series (exact policies) stay visible.
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr const char* kDashes[] = {"", "6,4", "2,3", "8,3,2,3", "1,2", "10,4", "4,4"};

// Red (0) -> yellow (0.5) -> green (1), as in the NIAH heatmaps.
std::string heat_color(double v) {
  if (!std::isfinite(v)) return "#dddddd";
  v = std::clamp(v, 0.0, 1.0);
  const double r = v < 0.5 ? 0.84 : 0.84 - (v - 0.5) * 2 * (0.84 - 0.20);
  const double g = v < 0.5 ? 0.19 + v * 2 * (0.80 - 0.19) : 0.80 - (v - 0.5) * 2 * (0.80 - 0.63);
  const double b = v < 0.5 ? 0.15 + v * 2 * (0.25 - 0.15) : 0.25 + (v - 0.5) * 2 * (0.33 - 0.25);
  return fmt::format("#{:02x}{:02x}{:02x}", static_cast<int>(r * 255), static_cast<int>(g * 255),
                     static_cast<int>(b * 255));
}

std::string text(double x, double y, const std::string& s, const char* anchor = "middle", int size = 12,
                 const char* extra = "") {
  return fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\" font-size=\"{}\" {} {}>{}</text>\n",
                     x, y, anchor, size, kFont, extra, xml_escape(s));
}

std::string header(double w, double h) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} "
      "{1:.0f}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      w, h);
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string heatmap_svg(const Heatmap& h) {
  const double cw = 64, top = 44, bottom = 60, legend = 90;
  const double nx = static_cast<double>(h.x_labels.size()), ny = static_cast<double>(h.y_labels.size());
  // Rows of 30 px, but the grid at least 100 px tall, so that the rotated axis title and the colour
  // scale (as tall as the grid) fit beside one or two rows.
  const double gh = std::max(30.0 * ny, 100.0), ch = ny > 0 ? gh / ny : gh;
  // Wide enough for the title (DejaVu Sans Bold at 15 px: about 10.5 px per character); a grid
  // narrower than the title is centred under it.
  const double content = 70 + cw * nx + legend;
  const double w = std::max(content, 10.5 * static_cast<double>(h.title.size()) + 20), ht = top + gh + bottom;
  const double dx = (w - content) / 2, left = 70 + dx, axis_x = 16 + dx;
  std::string s = header(w, ht);
  s += text(w / 2, 24, h.title, "middle", 15, "font-weight=\"bold\"");
  for (size_t y = 0; y < h.y_labels.size(); ++y) {
    for (size_t x = 0; x < h.x_labels.size(); ++x) {
      const double v = y < h.values.size() && x < h.values[y].size() ? h.values[y][x] : NAN;
      const double px = left + cw * static_cast<double>(x), py = top + ch * static_cast<double>(y);
      s += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" "
          "stroke=\"white\" stroke-width=\"1\"/>\n",
          px, py, cw, ch, heat_color(v));
      s += text(px + cw / 2, py + ch / 2 + 4, std::isfinite(v) ? fmt::format("{:.0f}", v * 100) : "-",
                "middle", 11);
    }
    s += text(left - 6, top + ch * (static_cast<double>(y) + 0.5) + 4, h.y_labels[y], "end", 11);
  }
  for (size_t x = 0; x < h.x_labels.size(); ++x)
    s += text(left + cw * (static_cast<double>(x) + 0.5), top + gh + 16, h.x_labels[x], "middle", 11);
  s += text(left + cw * nx / 2, top + gh + 40, "context length (tokens)", "middle", 12);
  s += text(axis_x, top + gh / 2, "needle depth", "middle", 12,
            fmt::format("transform=\"rotate(-90 {:.1f} {:.1f})\"", axis_x, top + gh / 2).c_str());
  // Colour scale.
  const double lx = left + cw * nx + 24, lh = gh;
  for (int i = 0; i < 20; ++i) {
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"{:.2f}\" fill=\"{}\"/>\n", lx,
                     top + lh * i / 20.0, lh / 20.0 + 0.5, heat_color(1.0 - i / 19.0));
  }
  s += text(lx + 18, top + 8, "100%", "start", 10);
  s += text(lx + 18, top + lh, "0%", "start", 10);
  s += "</svg>\n";
  return s;
}

namespace {
// Room right of the plot for the legend: its line and the longest name (12 px text, about 7.2 px a
// character).
double legend_width(const LinePlot& p) {
  size_t longest = 0;
  for (const Series& se : p.series) longest = std::max(longest, se.name.size());
  return std::max(150.0, 7.2 * static_cast<double>(longest) + 60);
}
}  // namespace

double line_plot_width(const LinePlot& p) {
  return 70 + std::max(300.0, 90.0 * static_cast<double>(p.x_labels.size())) + legend_width(p);
}
double line_plot_height(const LinePlot& p) {
  // The legend (20 px a series) fits beside the 260 px plot up to 12 series.
  return 44 + std::max(260.0, 20.0 * static_cast<double>(p.series.size()) + 20) + 56;
}

std::string line_plot_svg(const LinePlot& p) {
  const double left = 70, right = legend_width(p), top = 44,
               pw = std::max(300.0, 90.0 * static_cast<double>(p.x_labels.size())),
               ph = line_plot_height(p) - 44 - 56, bottom = 56;
  const double w = left + pw + right, ht = top + ph + bottom;
  double lo = 0, hi = 1;
  if (!p.unit_range) {
    lo = p.y_from_zero ? 0.0 : INFINITY;
    hi = -INFINITY;
    for (const Series& se : p.series) {
      for (double v : se.y) {
        if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
      }
    }
    if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
    const double pad = std::max((hi - lo) * 0.1, std::abs(hi) * 0.01 + 1e-9);
    if (!p.y_from_zero) lo -= pad;
    hi += pad;
  }
  const size_t n = p.x_labels.size();
  const auto px = [&](size_t i) {
    return left + (n <= 1 ? pw / 2 : pw * static_cast<double>(i) / static_cast<double>(n - 1));
  };
  const auto py = [&](double v) { return top + ph - (v - lo) / (hi - lo) * ph; };
  std::string s = header(w, ht);
  s += text(left + pw / 2, 24, p.title, "middle", 15, "font-weight=\"bold\"");
  for (int i = 0; i <= 4; ++i) {  // horizontal grid and y ticks
    const double v = lo + (hi - lo) * i / 4.0;
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e0e0e0\"/>\n",
                     left, py(v), left + pw, py(v));
    s += text(left - 6, py(v) + 4, p.unit_range ? fmt::format("{:.0f}%", v * 100) : fmt::format("{:.3g}", v),
              "end", 11);
  }
  s += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#888\"/>\n",
      left, top, pw, ph);
  for (size_t i = 0; i < n; ++i) s += text(px(i), top + ph + 16, p.x_labels[i], "middle", 11);
  s += text(left + pw / 2, top + ph + 40, "context length (tokens)", "middle", 12);
  s += text(16, top + ph / 2, p.y_label, "middle", 12,
            fmt::format("transform=\"rotate(-90 16 {:.1f})\"", top + ph / 2).c_str());
  for (size_t k = 0; k < p.series.size(); ++k) {
    const Series& se = p.series[k];
    const char* color = kColors[k % std::size(kColors)];
    const char* dash = kDashes[k % std::size(kDashes)];
    std::string pts;
    for (size_t i = 0; i < se.y.size() && i < n; ++i) {
      if (!std::isfinite(se.y[i])) continue;
      pts += fmt::format("{:.1f},{:.1f} ", px(i), py(se.y[i]));
      const double r = 6.0 - 1.5 * static_cast<double>(k % 3);  // shrinking markers: overlaps stay visible
      s +=
          fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:.1f}\" fill=\"{}\" fill-opacity=\"0.8\"/>\n",
                      px(i), py(se.y[i]), r, color);
    }
    s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", pts,
                     color, *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "");
    const double ly = top + 10 + 20 * static_cast<double>(k);
    s += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        left + pw + 14, ly, left + pw + 40, ly, color,
        *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "");
    s += text(left + pw + 46, ly + 4, se.name, "start", 12);
  }
  s += "</svg>\n";
  return s;
}

std::string xy_plot_svg(const XyPlot& p) {
  size_t longest = 0;
  for (const XySeries& se : p.series) longest = std::max(longest, se.name.size());
  const double left = 70, right = std::max(150.0, 7.2 * static_cast<double>(longest) + 60), top = 44,
               pw = 420, ph = std::max(300.0, 20.0 * static_cast<double>(p.series.size()) + 20), bottom = 56;
  // Wide enough for the title (DejaVu Sans Bold at 15 px: about 10.5 px per character).
  const double w = std::max(left + pw + right, 10.5 * static_cast<double>(p.title.size()) + 20),
               ht = top + ph + bottom;
  // x: powers of two around the data (always including 1 = the reference).
  double lx_lo = 0, lx_hi = 0, y_hi = p.y_max, y_lo = p.y_min;
  for (const XySeries& se : p.series) {
    for (const XyPoint& q : se.points) {
      if (!(q.x > 0) || !std::isfinite(q.y)) continue;
      lx_lo = std::min(lx_lo, std::floor(std::log2(q.x)));
      lx_hi = std::max(lx_hi, std::ceil(std::log2(q.x)));
      y_hi = std::max(y_hi, q.y);
      y_lo = std::min(y_lo, q.y);
    }
  }
  if (lx_hi - lx_lo < 1) lx_lo -= 1;
  // y ticks at a round step (a quarter of a unit for percentages), room above the top one for markers.
  const double raw_step = (y_hi - y_lo) / 4;
  const double mag = std::pow(10.0, std::floor(std::log10(raw_step > 0 ? raw_step : 1.0)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * mag >= raw_step) {
      step = m * mag;
      break;
    }
  }
  if (p.y_percent && step < 0.25 && y_hi - y_lo >= 0.5) step = 0.25;
  y_lo = std::floor(y_lo / step + 1e-9) * step;
  const double y_top_tick = std::ceil(y_hi / step - 1e-9) * step;
  y_hi = y_top_tick + step * 0.15;
  // A margin of 0.2 octave on each side, so that markers on the first and last tick are whole.
  const auto px = [&](double x) { return left + pw * (std::log2(x) - lx_lo + 0.2) / (lx_hi - lx_lo + 0.4); };
  const auto py = [&](double v) { return top + ph - (v - y_lo) / (y_hi - y_lo) * ph; };
  std::string s = header(w, ht);
  s += text(w / 2, 24, p.title, "middle", 15, "font-weight=\"bold\"");
  for (double v = y_lo; v <= y_top_tick + step * 1e-6; v += step) {
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e0e0e0\"/>\n",
                     left, py(v), left + pw, py(v));
    s += text(left - 6, py(v) + 4, p.y_percent ? fmt::format("{:.0f}%", v * 100) : fmt::format("{:.3g}", v),
              "end", 11);
  }
  for (double e = lx_lo; e <= lx_hi + 1e-9; e += 1) {
    const double x = std::exp2(e);
    s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"{3}\"/>\n",
                     px(x), top, top + ph, e == 0 ? "#999999" : "#e0e0e0");
    s += text(px(x), top + ph + 16, e >= 0 ? fmt::format("{:g}", x) : fmt::format("1/{:g}", 1 / x), "middle",
              11);
  }
  s += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#888\"/>\n",
      left, top, pw, ph);
  s += text(left + pw / 2, top + ph + 40, p.x_label, "middle", 12);
  s += text(16, top + ph / 2, p.y_label, "middle", 12,
            fmt::format("transform=\"rotate(-90 16 {:.1f})\"", top + ph / 2).c_str());
  for (size_t k = 0; k < p.series.size(); ++k) {
    const XySeries& se = p.series[k];
    const char* color = kColors[k % std::size(kColors)];
    const char* dash = kDashes[k % std::size(kDashes)];
    std::vector<XyPoint> pts;
    for (const XyPoint& q : se.points) {
      if (q.x > 0 && std::isfinite(q.y)) pts.push_back(q);
    }
    std::sort(pts.begin(), pts.end(), [](const XyPoint& a, const XyPoint& b) { return a.x < b.x; });
    std::string line;
    const double r = 6.0 - 1.5 * static_cast<double>(k % 3);  // shrinking markers: overlaps stay visible
    for (const XyPoint& q : pts) {
      line += fmt::format("{:.1f},{:.1f} ", px(q.x), py(q.y));
      s +=
          fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:.1f}\" fill=\"{}\" fill-opacity=\"0.8\"/>\n",
                      px(q.x), py(q.y), r, color);
      if (!q.label.empty())
        s += text(px(q.x) + 6, py(q.y) - 7, q.label, "start", 10, fmt::format("fill=\"{}\"", color).c_str());
    }
    if (pts.size() > 1) {
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", line,
                       color, *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "");
    }
    const double ly = top + 10 + 20 * static_cast<double>(k);
    s += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        left + pw + 14, ly, left + pw + 40, ly, color,
        *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "");
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:.1f}\" fill=\"{}\"/>\n", left + pw + 27, ly,
                     r, color);
    s += text(left + pw + 46, ly + 4, se.name, "start", 12);
  }
  s += "</svg>\n";
  return s;
}

std::string panels_svg(const std::string& title, const std::vector<Panel>& panels, int columns) {
  columns = std::max(1, columns);
  std::vector<double> col_w(static_cast<size_t>(columns), 0.0);
  std::vector<double> row_h((panels.size() + static_cast<size_t>(columns) - 1) / static_cast<size_t>(columns),
                            0.0);
  for (size_t i = 0; i < panels.size(); ++i) {
    col_w[i % static_cast<size_t>(columns)] =
        std::max(col_w[i % static_cast<size_t>(columns)], panels[i].width);
    row_h[i / static_cast<size_t>(columns)] =
        std::max(row_h[i / static_cast<size_t>(columns)], panels[i].height);
  }
  const double top = 40;
  double w = 0, h = top;
  for (double c : col_w) w += c;
  for (double r : row_h) h += r;
  std::string s = header(w, h);
  s += text(w / 2, 26, title, "middle", 17, "font-weight=\"bold\"");
  double y = top;
  for (size_t row = 0; row < row_h.size(); ++row) {
    double x = 0;
    for (size_t c = 0; c < col_w.size(); ++c) {
      const size_t i = row * static_cast<size_t>(columns) + c;
      if (i < panels.size())
        s += fmt::format("<g transform=\"translate({:.1f} {:.1f})\">\n{}</g>\n", x, y, panels[i].svg);
      x += col_w[c];
    }
    y += row_h[row];
  }
  s += "</svg>\n";
  return s;
}

}  // namespace kvtier::eval
