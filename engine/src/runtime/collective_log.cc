#include "engine/src/runtime/collective_log.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "engine/src/runtime/fingerprint.h"

namespace zeroshard::internal {

const char* WaitSiteName(WaitSite site) {
  switch (site) {
    case WaitSite::kGradViewSlot:
      return "GradView: staging slot's reduction";
    case WaitSite::kStepReductions:
      return "Step: gradient reductions";
    case WaitSite::kRecordExchange:
      return "norm / record exchange";
    case WaitSite::kParamGather:
      return "Gather: updated params (stages 1-2)";
    case WaitSite::kStage3Gather:
      return "Gather: stage-3 all-gather";
    case WaitSite::kStage3Evict:
      return "Gather: stage-3 slot reuse";
    case WaitSite::kStage3Drop:
      return "Step: stage-3 gather pool";
    case WaitSite::kGetParam:
      return "GetParam";
    case WaitSite::kSave:
      return "Save: updated params";
    case WaitSite::kModelParallel:
      return "model-parallel norm";
    case WaitSite::kSetFrozenParam:
      return "SetFrozenParam";
    case WaitSite::kNumSites:
      break;
  }
  return "?";
}

void CollectiveLog::Note(CollectiveKind kind, int unit, int64_t count) {
  ++total_;
  if (!check_sequence_) return;
  const int64_t record[3] = {static_cast<int64_t>(kind), unit, count};
  sequence_hash_ = HashBytes(record, sizeof(record), sequence_hash_ == 0 ? 1 : sequence_hash_);
  ++sequence_count_;
}

absl::Status CollectiveLog::Wait(CommHandle& handle, WaitSite site, StepTimeline& timeline) {
  if (!handle.valid()) return absl::OkStatus();
  const absl::Duration begin = timeline.Now();
  absl::Status status = handle.Wait();
  handle = CommHandle();
  const absl::Duration waited = timeline.Now() - begin;
  timeline.AddCommWait(waited);
  if (timeline.running()) {
    site_wait_[static_cast<int>(site)] += waited;
    ++site_waits_[static_cast<int>(site)];
  }
  return status;
}

std::string CollectiveLog::FormatWaits(int rank, int64_t steps) const {
  // One block per rank, written at once so that ranks do not interleave.
  std::string out = absl::StrFormat(
      "zeroshard: rank %d: collective waits over %d steps (ms per step, blocking waits)\n", rank,
      steps);
  const double per = static_cast<double>(std::max<int64_t>(1, steps));
  for (int s = 0; s < static_cast<int>(WaitSite::kNumSites); ++s) {
    if (site_waits_[s] == 0) continue;
    absl::StrAppendFormat(&out, "  %-38s %9.3f ms  (%.1f waits)\n",
                          WaitSiteName(static_cast<WaitSite>(s)),
                          absl::ToDoubleMilliseconds(site_wait_[s]) / per, site_waits_[s] / per);
  }
  return out;
}

}  // namespace zeroshard::internal
