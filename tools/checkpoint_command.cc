#include "tools/checkpoint_command.h"

#include <iomanip>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tools/estimate_command.h"
#include "tools/hf_export.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/estimate/byte_units.h"

namespace zeroshard::tools {
namespace {

const char kInspectUsage[] =
    "usage: zeroshard inspect DIR\n"
    "Verifies every checksum of a checkpoint (DIR: the directory given to Save, whose\n"
    "`latest` names the step, or a step_N directory) and prints what it holds.\n"
    "Exit codes: 0 sound, 1 damaged (one line per problem), 2 bad input.\n";

const char kExportUsage[] =
    "usage: zeroshard export DIR --out FILE [--dtype fp32|bf16]\n"
    "       zeroshard export DIR --hf OUTDIR [--dtype fp32|bf16]\n"
    "Writes the consolidated weights of a checkpoint as a safetensors file, one tensor\n"
    "per param named <unit>.<param> (fp32: the master weights exactly; bf16: rounded\n"
    "to nearest even), streaming unit by unit.\n"
    "--hf: a GPT trainer checkpoint (examples/gpt) as a Hugging Face directory that\n"
    "GPT2LMHeadModel.from_pretrained(OUTDIR) loads: OUTDIR/model.safetensors under\n"
    "GPT-2's names (transformer.h.0.attn.c_attn.weight, ...; the tied lm_head.weight\n"
    "not stored) and OUTDIR/config.json (the run's config, dropout 0). OUTDIR must be\n"
    "new or empty; it appears complete or not at all.\n"
    "Exit codes: 0 written, 2 bad input or a damaged checkpoint.\n";

std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

// Progress lines on `err` for long work: nothing in the first 2 s, then at
// most one line a second.
CheckpointProgress ProgressLines(const char* what, std::ostream& err) {
  const absl::Time begin = absl::Now();
  auto last = std::make_shared<absl::Time>(begin);
  return [what, &err, begin, last](int64_t done, int64_t total) {
    const absl::Time now = absl::Now();
    if (now - begin < absl::Seconds(2) || now - *last < absl::Seconds(1) || total <= 0) return;
    *last = now;
    err << absl::StrFormat("zeroshard %s: %s of %s (%.0f%%), %.0f s\n", what, Mib(done), Mib(total),
                           100.0 * static_cast<double>(done) / total,
                           absl::ToDoubleSeconds(now - begin));
  };
}

}  // namespace

int RunInspect(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    out << kInspectUsage;
    return kExitOk;
  }
  if (args.size() != 1 || args[0].empty() || args[0][0] == '-') {
    err << "zeroshard inspect: give exactly one checkpoint directory; see --help\n";
    return kExitBadInput;
  }
  const absl::Time begin = absl::Now();
  std::vector<std::string> problems;
  absl::StatusOr<CheckpointInfo> info =
      InspectCheckpoint(args[0], &problems, ProgressLines("inspect: verified", err));
  if (!info.ok()) {
    err << "zeroshard inspect: " << info.status().message() << "\n";
    return kExitBadInput;
  }
  int64_t total = 0;
  for (int64_t b : info->file_bytes) total += b;
  if (!info->note.empty()) err << "zeroshard inspect: note: " << info->note << "\n";
  out << "checkpoint  " << info->path << "\n"
      << "step        " << info->step << "\n"
      << "written by  " << info->world_size << " rank(s), ZeRO stage " << info->zero_stage << ", "
      << PrecisionName(info->precision) << "\n"
      << "model       " << info->num_params << " params in " << info->num_units << " units\n"
      << "files       " << info->file_bytes.size() << " rank files, " << Mib(total) << " ("
      << Mib(info->file_bytes.empty() ? 0 : info->file_bytes[0]) << " per rank)\n"
      << "trainer     " << info->trainer_state << "\n";
  out << absl::StrFormat("checksums   %s (%.2f s)\n", problems.empty() ? "all sound" : "DAMAGED",
                         absl::ToDoubleSeconds(absl::Now() - begin));
  for (const std::string& p : problems) err << "zeroshard inspect: " << p << "\n";
  return problems.empty() ? kExitOk : 1;
}

int RunExport(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string dir, file, hf_dir;
  DType dtype = DType::kFloat32;
  bool out_given = false, dtype_given = false, hf_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      out << kExportUsage;
      return kExitOk;
    }
    if (a == "--out" || a == "--dtype" || a == "--hf") {
      if (i + 1 >= args.size()) {
        err << "zeroshard export: " << a << " needs a value; see --help\n";
        return kExitBadInput;
      }
      bool& given = a == "--out" ? out_given : a == "--hf" ? hf_given : dtype_given;
      if (given) {
        err << "zeroshard export: " << a << " is given twice; give it once\n";
        return kExitBadInput;
      }
      given = true;
      const std::string& v = args[++i];
      if (a == "--out") {
        file = v;
      } else if (a == "--hf") {
        hf_dir = v;
      } else if (v == "fp32" || v == "bf16") {
        dtype = v == "fp32" ? DType::kFloat32 : DType::kBFloat16;
      } else {
        err << "zeroshard export: --dtype '" << v << "' is not fp32 or bf16\n";
        return kExitBadInput;
      }
      continue;
    }
    if (!a.empty() && a[0] == '-') {
      err << "zeroshard export: unknown flag '" << a << "'; see --help\n";
      return kExitBadInput;
    }
    if (!dir.empty()) {
      err << "zeroshard export: give one checkpoint directory, not '" << dir << "' and '" << a
          << "'\n";
      return kExitBadInput;
    }
    dir = a;
  }
  if (out_given && hf_given) {
    err << "zeroshard export: give --out FILE or --hf OUTDIR, not both\n";
    return kExitBadInput;
  }
  if (dir.empty() || (file.empty() && hf_dir.empty())) {
    err << "zeroshard export: give a checkpoint directory and --out FILE or --hf OUTDIR; see "
           "--help\n";
    return kExitBadInput;
  }
  const absl::Time begin = absl::Now();
  ExportStats stats;
  absl::Status status =
      hf_given ? ExportHfGpt2(dir, hf_dir, dtype, &stats, ProgressLines("export: wrote", err))
               : ExportSafetensors(dir, file, dtype, &stats, ProgressLines("export: wrote", err));
  if (!status.ok()) {
    err << "zeroshard export: " << status.message() << "\n";
    return kExitBadInput;
  }
  out << absl::StrFormat(
      "wrote %s: %d tensors, %s, %s; at most %s of weights held at once (%.2f s)\n",
      hf_given ? hf_dir + "/model.safetensors and config.json" : file, stats.tensors,
      DTypeName(dtype), Mib(stats.bytes_written), Mib(stats.peak_buffer_bytes),
      absl::ToDoubleSeconds(absl::Now() - begin));
  return kExitOk;
}

}  // namespace zeroshard::tools
