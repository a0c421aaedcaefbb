// CollectiveLog: what the engine knows about the collectives it issued and
// waited for. It owns three things:
//   - the count of collectives since the engine was created (EngineStats),
//   - this step's collective-sequence hash (every rank must issue the same
//     kinds, units and sizes in the same order; Step() compares the hashes
//     in the norm's all-gather, engine_step.cc),
//   - the wait sites: where the engine blocked on a collective, and for how
//     long (ZS_DEBUG_COMM_WAITS prints them when the engine is destroyed).
#ifndef ZEROSHARD_RUNTIME_COLLECTIVE_LOG_H_
#define ZEROSHARD_RUNTIME_COLLECTIVE_LOG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/src/runtime/step_timeline.h"
#include "zeroshard/communicator.h"

namespace zeroshard::internal {

// Set in the environment (any value): each engine prints on stderr, when it
// is destroyed, where its steps waited on collectives (WaitSite).
inline constexpr char kDebugCommWaitsEnvVar[] = "ZS_DEBUG_COMM_WAITS";

// The kinds of collective the engine issues, as the sequence hash folds them.
enum class CollectiveKind : uint64_t {
  kAllReduceGrads = 1,
  kReduceScatterGrads,
  kAllGatherParams,
  kGatherUnit,
  kGatherForRead,
  kFingerprint,
  kCheckpoint,
  kSetTrainable
};

// Where the engine waits on a collective: each wait is booked to its site.
enum class WaitSite {
  kGradViewSlot,    // GradView: every staging slot's reduction in flight
  kStepReductions,  // Step: the reductions of the last micro-batch
  kRecordExchange,  // the norm's all-gather (and Start's, Save's exchanges)
  kParamGather,     // Gather, stages 1-2: the updated params' all-gather
  kStage3Gather,    // Gather, stage 3: the unit's all-gather (prefetch missed)
  kStage3Evict,     // Gather, stage 3: a slot's all-gather before reuse
  kStage3Drop,      // Step, stage 3: the gather pool's all-gathers
  kGetParam,        // GetParam (and its wait for the param all-gathers)
  kSave,            // Save: the updated params' all-gathers
  kModelParallel,   // the model-parallel group's norm all-reduce
  kSetFrozenParam,  // SetFrozenParam: the param all-gathers and a kept stage-3 copy
  kNumSites
};
const char* WaitSiteName(WaitSite site);

class CollectiveLog {
 public:
  // `check_sequence`: TrainSpec::check_collective_sequence; without it the
  // hash stays 0 and only the total is counted.
  explicit CollectiveLog(bool check_sequence) : check_sequence_(check_sequence) {}

  // The label every collective of `unit` carries (Communicator tag): two
  // ranks that move different units of equal size fail instead of mixing.
  static uint64_t UnitTag(int unit) { return static_cast<uint64_t>(unit) + 1; }

  // Folds one collective into this step's sequence hash. `unit` is a unit
  // index, or a negative phase for the engine's own record exchanges.
  void Note(CollectiveKind kind, int unit, int64_t count);
  // The step's record, as Step() exchanges it; then a fresh one for the
  // next step.
  uint64_t sequence_hash() const { return sequence_hash_; }
  int64_t sequence_count() const { return sequence_count_; }
  void BeginNextStep() {
    sequence_hash_ = 0;
    sequence_count_ = 0;
  }
  // Collectives noted since the engine was created (EngineStats::collectives).
  int64_t total() const { return total_; }

  // Waits on `handle` (nothing when it is not valid: already waited or
  // never issued), counting the time as exposed communication on
  // `timeline` and, while steps run, booking it to `site`. Returns the
  // collective's status; the caller decides whether it poisons the engine.
  absl::Status Wait(CommHandle& handle, WaitSite site, StepTimeline& timeline);

  // Per site: the time waited during steps and how many waits there were.
  absl::Duration site_wait(WaitSite site) const { return site_wait_[static_cast<int>(site)]; }
  int64_t site_waits(WaitSite site) const { return site_waits_[static_cast<int>(site)]; }
  // The ZS_DEBUG_COMM_WAITS report: one block for `rank`, per step over
  // `steps` steps.
  std::string FormatWaits(int rank, int64_t steps) const;

 private:
  bool check_sequence_;
  uint64_t sequence_hash_ = 0;
  int64_t sequence_count_ = 0;
  int64_t total_ = 0;
  absl::Duration site_wait_[static_cast<int>(WaitSite::kNumSites)] = {};
  int64_t site_waits_[static_cast<int>(WaitSite::kNumSites)] = {};
};

}  // namespace zeroshard::internal

#endif  // ZEROSHARD_RUNTIME_COLLECTIVE_LOG_H_
