// `zeroshard estimate --machine PROFILE --model mlp ...`: the calibrated
// step time of an engine run (PredictMlpEngineStep, tools/mlp_step_model.h).
#ifndef ZEROSHARD_TOOLS_MACHINE_ESTIMATE_H_
#define ZEROSHARD_TOOLS_MACHINE_ESTIMATE_H_

#include <map>
#include <ostream>
#include <string>

namespace zeroshard::tools {

// The flags RunMachineEstimate reads besides estimate's own.
inline constexpr const char* kMachineFlags[] = {"--machine", "--model",   "--hidden",
                                                "--blocks",  "--backend", "--cpus-per-rank"};

// Runs the estimate with parsed flags (name -> value; switches "1"):
// --machine FILE --model mlp [--hidden H] [--blocks B] [--micro-batch M]
// [--gpus N (ranks)] [--stage S|auto] [--backend local|mpi]
// [--cpus-per-rank K (0: not bound)] [--json].
// Returns the exit code: 0, or 2 with one line on `err` naming the flag or
// the profile field.
int RunMachineEstimate(const std::map<std::string, std::string>& flags, std::ostream& out,
                       std::ostream& err);

}  // namespace zeroshard::tools

#endif  // ZEROSHARD_TOOLS_MACHINE_ESTIMATE_H_
