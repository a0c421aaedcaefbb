// Renders a Plan for people and programs: a fixed-width table, JSON (schema
// in docs/estimator.md) and an SVG stacked-bar chart of the per-GPU bytes.
#ifndef ZEROSHARD_ESTIMATE_REPORT_H_
#define ZEROSHARD_ESTIMATE_REPORT_H_

#include <string>
#include <vector>

#include "zeroshard/estimate/planner.h"

namespace zeroshard {

// The candidates worth a row: every sharding-only candidate; offload rows
// once sharding alone fails; tensor/pipeline splits once offload fails too
// (the fastest eight that fit, or the five smallest when none fits). `all`
// shows every candidate. Indices into plan.candidates, in order.
std::vector<int> ShownCandidates(const Plan& plan, bool all);

// One row per shown candidate, the chosen one marked '*', then why it won,
// why cheaper ones were rejected and, with a price or dataset size, the
// cost per epoch and the GPU-count sweep. Sizes in GiB (2^30 bytes).
std::string FormatTable(const Plan& plan, bool all);

// Every candidate (with its buffers), the choice and the reasons. Sizes in
// bytes, times in seconds.
std::string FormatJson(const Plan& plan, bool all);

// Stacked bars of the per-GPU breakdown for each shown candidate, with the
// GPU memory drawn as a dashed line. A standalone SVG 1.1 document.
std::string FormatSvg(const Plan& plan, bool all);

}  // namespace zeroshard

#endif  // ZEROSHARD_ESTIMATE_REPORT_H_
