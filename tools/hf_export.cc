#include "tools/hf_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "zeroshard/status.h"

namespace zeroshard::tools {
namespace {

namespace fs = std::filesystem;

std::optional<std::pair<dev_t, ino_t>> Identity(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return std::make_pair(st.st_dev, st.st_ino);
}

std::string Parent(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "out/" -> "out"
  fs::path parent = p.parent_path();
  return parent.empty() ? "." : parent.string();
}

std::string Basename(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(
      absl::StrFormat("export --hf: %s %s: %s", what, path, std::strerror(errno)));
}

absl::Status SyncPath(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return Errno("cannot open", path);
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) return Errno("cannot sync", path);
  return absl::OkStatus();
}

absl::Status WriteFileSynced(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", path);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const absl::Status s = Errno("cannot write", path);
      close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const absl::Status s = Errno("cannot sync", path);
    close(fd);
    return s;
  }
  if (close(fd) != 0) return Errno("cannot close", path);
  return absl::OkStatus();
}

// Refuses an output directory that exists with something in it, is not a
// directory, or lies in the checkpoint directory (whose steps later saves
// replace and prune).
absl::Status CheckOutDir(const std::string& path, const std::string& step_dir,
                         const std::string& out_dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(out_dir, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "export --hf: %s exists and is not a directory; give a new directory", out_dir));
    }
    if (!fs::is_empty(out_dir, ec) || ec) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "export --hf: %s exists and is not empty; give a new directory or empty it", out_dir));
    }
  }
  std::vector<std::string> held = {path, step_dir, Parent(step_dir)};
  const std::optional<std::pair<dev_t, ino_t>> parent = Identity(Parent(out_dir));
  if (!parent) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "export --hf: the directory %s that would hold %s does not exist; create it first",
        Parent(out_dir), out_dir));
  }
  for (const std::string& dir : held) {
    // The step's parent counts only when it is a checkpoint directory.
    if (dir == held[2] && !absl::StartsWith(Basename(step_dir), "step_")) continue;
    if (Identity(dir) == parent) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "export --hf: %s is inside the checkpoint directory %s, whose steps are replaced and "
          "pruned by later saves: give a directory outside it",
          out_dir, dir));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> HfGpt2TensorName(const std::string& unit, const std::string& param) {
  if (unit == "embed" || unit == "final_norm") return absl::StrCat("transformer.", param);
  if (unit == "lm_head") return param;
  int block = -1;
  if (absl::StartsWith(unit, "h.") && absl::SimpleAtoi(unit.substr(2), &block) && block >= 0 &&
      unit == absl::StrCat("h.", block)) {
    return absl::StrCat("transformer.", unit, ".", param);
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "export --hf: unit '%s' (param '%s') is not a unit of the GPT trainer's model (embed, "
      "h.<i>, final_norm, lm_head); --hf exports GPT checkpoints only: use --out FILE for "
      "other models",
      unit, param));
}

absl::StatusOr<std::string> HfGpt2ConfigJson(const std::string& trainer_state, DType dtype,
                                             const std::string& source) {
  nlohmann::json state = nlohmann::json::parse(trainer_state, nullptr, /*allow_exceptions=*/false);
  if (state.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "export --hf: the trainer state of %s is not JSON; the checkpoint is damaged", source));
  }
  if (!state.is_object() || !state.contains("hf_config") || !state["hf_config"].is_object()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "export --hf: the checkpoint %s has no \"hf_config\" in its trainer state, so it was not "
        "written by the GPT trainer (examples/gpt) and its Hugging Face config is unknown; use "
        "--out FILE to export its weights under zeroshard's names",
        source));
  }
  nlohmann::json config = state["hf_config"];
  for (const char* key : {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"}) {
    if (!config.contains(key) || !config[key].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "export --hf: the hf_config of %s lacks the integer \"%s\"; the checkpoint's trainer "
          "state is not the GPT trainer's",
          source, key));
    }
  }
  config["architectures"] = nlohmann::json::array({"GPT2LMHeadModel"});
  config["model_type"] = "gpt2";
  config["tie_word_embeddings"] = true;
  // The trainer has no dropout; transformers' defaults (0.1) would make a
  // model put in train mode differ from it.
  config["resid_pdrop"] = 0.0;
  config["embd_pdrop"] = 0.0;
  config["attn_pdrop"] = 0.0;
  // Byte-level tokens have no BOS or EOS; GPT2Config's default (50256) lies
  // past a small vocabulary and makes transformers warn.
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    if (!config.contains(key)) config[key] = nullptr;
  }
  config["torch_dtype"] = dtype == DType::kBFloat16 ? "bfloat16" : "float32";
  return config.dump(2) + "\n";
}

absl::Status ExportHfGpt2(const std::string& path, const std::string& out_dir, DType dtype,
                          ExportStats* stats, const CheckpointProgress& progress) {
  if (out_dir.empty()) {
    return absl::InvalidArgumentError("export --hf: give the directory to write");
  }
  ZS_ASSIGN_OR_RETURN(CheckpointInfo info, ReadCheckpointInfo(path));
  ZS_RETURN_IF_ERROR(CheckOutDir(path, info.path, out_dir));
  ZS_ASSIGN_OR_RETURN(std::string config, HfGpt2ConfigJson(info.trainer_state, dtype, info.path));

  // Everything goes into a temporary directory beside out_dir, renamed into
  // place once complete and synced: out_dir is whole or absent.
  std::string tmp = absl::StrCat(Parent(out_dir), "/.", Basename(out_dir), ".tmp.XXXXXX");
  if (mkdtemp(tmp.data()) == nullptr) return Errno("cannot create a directory like", tmp);
  absl::Status status = [&]() -> absl::Status {
    ExportOptions options;
    options.dtype = dtype;
    options.tensor_name = HfGpt2TensorName;
    ZS_RETURN_IF_ERROR(
        ExportSafetensors(path, tmp + "/model.safetensors", options, stats, progress));
    ZS_RETURN_IF_ERROR(WriteFileSynced(tmp + "/config.json", config));
    ZS_RETURN_IF_ERROR(SyncPath(tmp, /*directory=*/true));
    if (rename(tmp.c_str(), out_dir.c_str()) != 0) {
      return Errno(absl::StrCat("cannot rename ", tmp, " to"), out_dir);
    }
    return SyncPath(Parent(out_dir), /*directory=*/true);
  }();
  if (!status.ok()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // absent after a successful rename
  }
  return status;
}

}  // namespace zeroshard::tools
