// FormatSvg: the per-GPU breakdown as stacked bars, one per candidate.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "zeroshard/estimate/byte_units.h"
#include "zeroshard/estimate/report.h"

namespace zeroshard {
namespace {

std::string Escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    switch (ch) {
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
        out.push_back(ch);
    }
  }
  return out;
}

struct Segment {
  const char* name;
  const char* color;
  int64_t MemoryBreakdown::*field;
};

constexpr Segment kSegments[] = {
    {"params", "#4e79a7", &MemoryBreakdown::params},
    {"grads", "#f28e2b", &MemoryBreakdown::grads},
    {"master", "#e15759", &MemoryBreakdown::master},
    {"optimizer", "#76b7b2", &MemoryBreakdown::optimizer},
    {"buffers", "#59a14f", &MemoryBreakdown::buffers},
    {"activations", "#edc948", &MemoryBreakdown::activations},
    {"workspace", "#b07aa1", &MemoryBreakdown::workspace},
    {"reserve", "#9c755f", &MemoryBreakdown::reserve},
};

}  // namespace

std::string FormatSvg(const Plan& plan, bool all) {
  const std::vector<int> shown = ShownCandidates(plan, all);
  const int bar_width = 56;
  const int gap = 40;
  const int left = 70, right = 170, top = 50, plot_height = 360, bottom = 150;
  const int n = std::max<int>(1, static_cast<int>(shown.size()));
  const int width = left + n * (bar_width + gap) + right;
  const int height = top + plot_height + bottom;
  int64_t max_bytes = plan.cluster.gpu_mem_bytes;
  for (int i : shown) max_bytes = std::max(max_bytes, plan.candidates[i].per_gpu.total());
  const double gib_max = static_cast<double>(max_bytes) / static_cast<double>(kGiB) * 1.08;
  auto y_of = [&](double gib) { return top + plot_height - gib / gib_max * plot_height; };

  std::string svg;
  absl::StrAppendFormat(&svg,
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
                        "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
                        "font-size=\"11\">\n",
                        width, height, width, height);
  absl::StrAppendFormat(&svg, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width, height);
  absl::StrAppendFormat(&svg,
                        "<text x=\"%d\" y=\"24\" font-size=\"14\" font-weight=\"bold\">%s: "
                        "per-GPU memory, %d GPUs x %s GiB (GiB = 2^30 bytes)</text>\n",
                        left, Escape(plan.model_name), plan.cluster.gpus,
                        FormatGiB(plan.cluster.gpu_mem_bytes));
  // Axis with ticks every round step.
  const double raw_step = gib_max / 6;
  double step = 1;
  for (double s : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
                   10000.0, 20000.0, 50000.0, 100000.0}) {
    step = s;
    if (s >= raw_step) break;
  }
  for (double g = 0; g <= gib_max; g += step) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                          left, y_of(g), width - right, y_of(g), left - 6, y_of(g) + 4, g);
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" "
                        "text-anchor=\"middle\">GiB per GPU</text>\n",
                        top + plot_height / 2, top + plot_height / 2);
  for (size_t k = 0; k < shown.size(); ++k) {
    const Candidate& c = plan.candidates[shown[k]];
    const int x = left + gap / 2 + static_cast<int>(k) * (bar_width + gap);
    double base = 0;
    for (const Segment& s : kSegments) {
      const double gib = static_cast<double>(c.per_gpu.*s.field) / static_cast<double>(kGiB);
      if (gib <= 0) continue;
      absl::StrAppendFormat(&svg,
                            "<rect x=\"%d\" y=\"%.2f\" width=\"%d\" height=\"%.2f\" fill=\"%s\">"
                            "<title>%s: %s GiB</title></rect>\n",
                            x, y_of(base + gib), bar_width, y_of(base) - y_of(base + gib), s.color,
                            s.name, FormatGiB(c.per_gpu.*s.field));
      base += gib;
    }
    absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"middle\">%s%s</text>\n",
                          x + bar_width / 2, y_of(base) - 4, FormatGiB(c.per_gpu.total()),
                          static_cast<int>(shown[k]) == plan.chosen ? " *" : "");
    const int label_y = top + plot_height + 12;
    absl::StrAppendFormat(&svg,
                          "<text x=\"%d\" y=\"%d\" transform=\"rotate(40 %d %d)\" "
                          "fill=\"%s\">%s</text>\n",
                          x + 4, label_y, x + 4, label_y, c.fits ? "black" : "#b00",
                          Escape(c.Label()));
  }
  const double limit_y =
      y_of(static_cast<double>(plan.cluster.gpu_mem_bytes) / static_cast<double>(kGiB));
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#b00\" "
                        "stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n"
                        "<text x=\"%d\" y=\"%.1f\" fill=\"#b00\">GPU memory %s GiB</text>\n",
                        left, limit_y, width - right, limit_y, width - right + 6, limit_y + 4,
                        FormatGiB(plan.cluster.gpu_mem_bytes));
  int legend_y = top + 20;
  for (const Segment& s : kSegments) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                          "<text x=\"%d\" y=\"%d\">%s</text>\n",
                          width - right + 10, legend_y, s.color, width - right + 28, legend_y + 10,
                          s.name);
    legend_y += 18;
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

}  // namespace zeroshard
