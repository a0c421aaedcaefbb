#include "examples/gpt/hf_weights.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "zeroshard/estimate/model_source.h"
#include "zeroshard/input_file.h"
#include "zeroshard/status.h"

namespace zeroshard::gpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A safetensors header larger than this is refused (the format's reference
// reader has the same limit), so a damaged length cannot allocate the file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// model.safetensors's role in messages.
constexpr char kWeightsRole[] = "the --init-from weights (model.safetensors)";

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A block's mask buffers, which are not params: "h.<i>.attn.bias" and
// "h.<i>.attn.masked_bias" (names without the "transformer." prefix).
bool IsMaskBuffer(const std::string& name) {
  if (!absl::StartsWith(name, "h.")) return false;
  const size_t dot = name.find('.', 2);
  int block = 0;
  if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(2, dot - 2), &block)) return false;
  const std::string rest = name.substr(dot + 1);
  return rest == "attn.bias" || rest == "attn.masked_bias";
}

std::string StripPrefix(const std::string& name) {
  constexpr char kPrefix[] = "transformer.";
  return absl::StartsWith(name, kPrefix) ? name.substr(sizeof(kPrefix) - 1) : name;
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrFormat("%s %s: %s", what, path, std::strerror(errno)));
}

std::string Parent(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  const fs::path parent = p.parent_path();
  return parent.empty() ? "." : parent.string();
}

std::string Basename(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("cannot write", path);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Errno("cannot open", path);
  const int rc = fsync(fd);
  close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("cannot sync", path);
}

// Writes `chunks` back to back into a new file `path`, synced.
absl::Status WriteFileSynced(const std::string& path,
                             const std::vector<std::pair<const void*, size_t>>& chunks) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", path);
  absl::Status s;
  for (const auto& [data, bytes] : chunks) {
    s = WriteAll(fd, data, bytes, path);
    if (!s.ok()) break;
  }
  if (s.ok() && fsync(fd) != 0) s = Errno("cannot sync", path);
  if (close(fd) != 0 && s.ok()) s = Errno("cannot close", path);
  return s;
}

}  // namespace

absl::StatusOr<std::string> HfGpt2Name(const std::string& unit, const std::string& param) {
  if (unit == "embed" || unit == "final_norm") return absl::StrCat("transformer.", param);
  if (unit == "lm_head") return param;
  int block = -1;
  if (absl::StartsWith(unit, "h.") && absl::SimpleAtoi(unit.substr(2), &block) && block >= 0 &&
      unit == absl::StrCat("h.", block)) {
    return absl::StrCat("transformer.", unit, ".", param);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unit '%s' (param '%s') has no Hugging Face GPT-2 name: the GPT model's "
                      "units are embed, h.<i>, final_norm and lm_head",
                      unit, param));
}

absl::StatusOr<InputFile> OpenHfGpt2Weights(const std::string& dir) {
  std::error_code ec;
  const std::string path =
      fs::is_directory(dir, ec) ? (fs::path(dir) / "model.safetensors").string() : dir;
  // No size cap: the file is read at offsets within the size it has, never
  // whole (a GPT-2 XL is 6 GB).
  absl::StatusOr<InputFile> file = InputFile::Open(path, kWeightsRole, kNoInputSizeCap);
  if (absl::IsNotFound(file.status())) {
    if (fs::exists(fs::path(dir) / "model.safetensors.index.json", ec)) {
      return absl::NotFoundError(absl::StrFormat(
          "%s holds a sharded checkpoint (model.safetensors.index.json), which is not supported: "
          "save it as one file (save_pretrained(dir, max_shard_size=\"100GB\"))",
          dir));
    }
    return absl::NotFoundError(absl::StrFormat(
        "%s; give a directory holding model.safetensors (Hugging Face's save_pretrained, or "
        "zeroshard export --hf)",
        file.status().message()));
  }
  return file;
}

absl::StatusOr<ParamValues> ReadHfGpt2Weights(const std::string& dir, const ModelSpec& spec) {
  ZS_ASSIGN_OR_RETURN(const InputFile in, OpenHfGpt2Weights(dir));
  const std::string& path = in.path();
  const auto file_size = static_cast<uint64_t>(in.size());
  unsigned char len_bytes[8] = {};
  if (file_size < 8) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: shorter than a safetensors header (%d bytes)", path, file_size));
  }
  ZS_RETURN_IF_ERROR(in.ReadAt(0, len_bytes, 8));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: header length %d is past the file's %d bytes or the 100 MB limit; the file is "
        "damaged or not safetensors",
        path, header_len, file_size));
  }
  std::string header(header_len, '\0');
  ZS_RETURN_IF_ERROR(in.ReadAt(8, header.data(), static_cast<int64_t>(header_len)));
  const json index = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the header is not a JSON object; the file is damaged", path));
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_bytes = file_size - data_start;

  // Expected tensors: name without the prefix -> (unit, param).
  std::map<std::string, std::pair<int, int>> expected;
  std::pair<int, int> owner_of_head = {-1, -1};
  for (size_t u = 0; u < spec.units.size(); ++u) {
    const UnitSpec& unit = spec.units[u];
    for (size_t p = 0; p < unit.params.size(); ++p) {
      if (unit.params[p].tied_to.has_value()) continue;
      absl::StatusOr<std::string> name = HfGpt2Name(unit.name, unit.params[p].name);
      if (!name.ok()) return name.status();
      expected[StripPrefix(*name)] = {static_cast<int>(u), static_cast<int>(p)};
      if (unit.name == "embed" && unit.params[p].name == "wte.weight") {
        owner_of_head = {static_cast<int>(u), static_cast<int>(p)};
      }
    }
  }

  ParamValues values(spec.units.size());
  for (size_t u = 0; u < spec.units.size(); ++u) values[u].resize(spec.units[u].params.size());
  std::map<std::string, std::string> seen;  // name without prefix -> name in the file
  std::vector<float> head;
  bool has_head = false;
  for (auto it = index.begin(); it != index.end(); ++it) {
    const std::string& file_name = it.key();
    if (file_name == "__metadata__") continue;
    const std::string name = StripPrefix(file_name);
    if (IsMaskBuffer(name)) continue;
    const bool is_head = name == "lm_head.weight";
    auto e = expected.find(name);
    if (!is_head && e == expected.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: unexpected tensor '%s': the model has no such param; is the file a GPT-2 of the "
          "same config (n_layer)?",
          path, file_name));
    }
    if (!seen.emplace(name, file_name).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: '%s' and '%s' name the same param; keep one", path, seen[name], file_name));
    }
    const json& t = it.value();
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the header entry of '%s' lacks dtype, shape or data_offsets; the file is damaged",
          path, file_name));
    }
    std::vector<int64_t> shape;
    for (const json& d : t["shape"]) {
      if (!d.is_number_unsigned()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: '%s' has a shape that is not a list of sizes", path, file_name));
      }
      shape.push_back(d.get<int64_t>());
    }
    if (is_head && owner_of_head.first < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: has lm_head.weight but the model has no embed wte.weight", path));
    }
    const std::vector<int64_t>& want =
        is_head ? spec.units[owner_of_head.first].params[owner_of_head.second].shape
                : spec.units[e->second.first].params[e->second.second].shape;
    if (shape != want) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: '%s' has shape %s where the model's is %s; the file's config differs from the "
          "run's (n_embd, n_layer, vocab_size, n_positions)",
          path, file_name, ShapeString(shape), ShapeString(want)));
    }
    const std::string dtype = t["dtype"].get<std::string>();
    size_t elem_bytes = 0;
    if (dtype == "F32") elem_bytes = 4;
    if (dtype == "BF16" || dtype == "F16") elem_bytes = 2;
    if (elem_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: '%s' has dtype %s; F32, BF16 and F16 are read", path, file_name, dtype));
    }
    const json& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: '%s' has bad data_offsets; the file is damaged", path, file_name));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    uint64_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
    if (begin > end || end > data_bytes || end - begin != numel * elem_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: '%s' has data_offsets [%d, %d] that do not hold %d %s elements within the %d "
          "data bytes; the file is damaged",
          path, file_name, begin, end, numel, dtype, data_bytes));
    }
    std::string raw(end - begin, '\0');
    ZS_RETURN_IF_ERROR(in.ReadAt(static_cast<int64_t>(data_start + begin), raw.data(),
                                 static_cast<int64_t>(raw.size())));
    std::vector<float> v(numel);
    if (dtype == "F32") {
      std::memcpy(v.data(), raw.data(), raw.size());
    } else {
      for (size_t i = 0; i < numel; ++i) {
        uint16_t h;
        std::memcpy(&h, raw.data() + 2 * i, 2);
        v[i] = dtype == "BF16" ? Bf16ToFp32(h) : Fp16ToFp32(h);
      }
    }
    if (is_head) {
      head = std::move(v);
      has_head = true;
    } else {
      values[e->second.first][e->second.second] = std::move(v);
    }
  }
  for (const auto& [name, where] : expected) {
    if (seen.count(name) == 0) {
      const UnitSpec& unit = spec.units[where.first];
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: no tensor for '%s' (unit %s, param %s), with or without the \"transformer.\" "
          "prefix; is the file a GPT-2 of the same config?",
          path, HfGpt2Name(unit.name, unit.params[where.second].name).value_or(name), unit.name,
          unit.params[where.second].name));
    }
  }
  if (has_head) {
    const std::vector<float>& wte = values[owner_of_head.first][owner_of_head.second];
    for (size_t i = 0; i < wte.size(); ++i) {
      if (std::memcmp(&wte[i], &head[i], sizeof(float)) != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: lm_head.weight differs from transformer.wte.weight (element %d: %g vs %g), but "
            "the model ties them (one tensor); an untied head cannot be loaded",
            path, i, head[i], wte[i]));
      }
    }
  }
  return values;
}

absl::Status CheckHfGpt2Config(const std::string& dir, const GptConfig& run,
                               const std::string& run_config_path) {
  const std::string path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--init-from %s has no config.json, so the weights' model cannot be checked against "
        "--config %s (the safetensors shapes do not show n_head or the epsilon); copy the "
        "config.json that belongs to the weights there (save_pretrained and zeroshard export "
        "--hf write one)",
        dir, run_config_path));
  }
  ZS_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "--init-from's config.json"));
  ZS_ASSIGN_OR_RETURN(const GptConfig theirs, ParseGptConfig(text, path));
  return CheckSameModel(GptModelIdentity(theirs), GptModelIdentity(run), path,
                        absl::StrFormat("the run's config (--config %s)", run_config_path),
                        "give --init-from the weights of this model, or --config theirs");
}

absl::Status WriteHfGpt2Dir(const std::string& dir, const ModelSpec& spec,
                            const ParamValues& values, const std::string& hf_config_json,
                            DType dtype) {
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "WriteHfGpt2Dir %s: dtype %s is not supported; use fp32 or bf16", dir, DTypeName(dtype)));
  }
  json config = json::parse(hf_config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "WriteHfGpt2Dir %s: the config is not a JSON object (give the run's config.json)", dir));
  }
  config["architectures"] = json::array({"GPT2LMHeadModel"});
  config["model_type"] = "gpt2";
  config["tie_word_embeddings"] = true;
  // No dropout in the trainer; transformers' default is 0.1.
  config["resid_pdrop"] = 0.0;
  config["embd_pdrop"] = 0.0;
  config["attn_pdrop"] = 0.0;
  // Byte-level tokens have no BOS or EOS; GPT2Config's default (50256) lies
  // past a small vocabulary and makes transformers warn.
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    if (!config.contains(key)) config[key] = nullptr;
  }
  config["torch_dtype"] = dtype == DType::kBFloat16 ? "bfloat16" : "float32";

  if (values.size() != spec.units.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("WriteHfGpt2Dir %s: %d units of values for a model of %d units", dir,
                        values.size(), spec.units.size()));
  }
  // The header, and where each written tensor's values are.
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<const std::vector<float>*> order;
  uint64_t offset = 0;
  const size_t elem_bytes = dtype == DType::kFloat32 ? 4 : 2;
  for (size_t u = 0; u < spec.units.size(); ++u) {
    const UnitSpec& unit = spec.units[u];
    if (values[u].size() != unit.params.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("WriteHfGpt2Dir %s: unit %s has %d params of values, the model %d", dir,
                          unit.name, values[u].size(), unit.params.size()));
    }
    for (size_t p = 0; p < unit.params.size(); ++p) {
      const ParamSpec& param = unit.params[p];
      absl::StatusOr<std::string> name = HfGpt2Name(unit.name, param.name);
      if (!name.ok()) return name.status();
      const std::vector<float>& v = values[u][p];
      if (param.tied_to.has_value()) {
        if (v.empty()) continue;
        // The alias's values, when given, must be the owner's.
        for (size_t ou = 0; ou < spec.units.size(); ++ou) {
          if (spec.units[ou].name != param.tied_to->unit) continue;
          for (size_t op = 0; op < spec.units[ou].params.size(); ++op) {
            if (spec.units[ou].params[op].name == param.tied_to->param && values[ou][op] != v) {
              return absl::InvalidArgumentError(absl::StrFormat(
                  "WriteHfGpt2Dir %s: %s.%s is tied to %s.%s but its values differ", dir, unit.name,
                  param.name, param.tied_to->unit, param.tied_to->param));
            }
          }
        }
        continue;
      }
      if (static_cast<int64_t>(v.size()) != param.NumElements()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "WriteHfGpt2Dir %s: %s.%s has %d values, its shape %s holds %d", dir, unit.name,
            param.name, v.size(), ShapeString(param.shape), param.NumElements()));
      }
      header[*name] = {{"dtype", dtype == DType::kFloat32 ? "F32" : "BF16"},
                       {"shape", param.shape},
                       {"data_offsets", {offset, offset + v.size() * elem_bytes}}};
      offset += v.size() * elem_bytes;
      order.push_back(&v);
    }
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // data 8-byte aligned
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i)
    len_bytes[i] = static_cast<unsigned char>(header_text.size() >> (8 * i));

  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && (!fs::is_directory(st) || !fs::is_empty(dir, ec))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "WriteHfGpt2Dir: %s exists and is not an empty directory; give a new directory", dir));
  }
  std::string tmp = absl::StrCat(Parent(dir), "/.", Basename(dir), ".tmp.XXXXXX");
  if (mkdtemp(tmp.data()) == nullptr) return Errno("cannot create a directory like", tmp);
  absl::Status status = [&]() -> absl::Status {
    std::vector<std::vector<uint16_t>> halves;
    std::vector<std::pair<const void*, size_t>> chunks = {{len_bytes, 8},
                                                          {header_text.data(), header_text.size()}};
    halves.reserve(order.size());
    for (const std::vector<float>* v : order) {
      if (dtype == DType::kFloat32) {
        chunks.push_back({v->data(), v->size() * sizeof(float)});
      } else {
        halves.emplace_back(v->size());
        for (size_t i = 0; i < v->size(); ++i) halves.back()[i] = Fp32ToBf16((*v)[i]);
        chunks.push_back({halves.back().data(), v->size() * sizeof(uint16_t)});
      }
    }
    absl::Status s = WriteFileSynced(tmp + "/model.safetensors", chunks);
    if (!s.ok()) return s;
    const std::string config_text = config.dump(2) + "\n";
    s = WriteFileSynced(tmp + "/config.json", {{config_text.data(), config_text.size()}});
    if (!s.ok()) return s;
    s = SyncDir(tmp);
    if (!s.ok()) return s;
    if (rename(tmp.c_str(), dir.c_str()) != 0) return Errno("cannot rename " + tmp + " to", dir);
    return SyncDir(Parent(dir));
  }();
  if (!status.ok()) fs::remove_all(tmp, ec);
  return status;
}

absl::Status SetEngineParams(Engine& engine, const ParamValues& values) {
  const ModelSpec& spec = engine.model();
  if (values.size() != spec.units.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SetEngineParams: %d units of values for a model of %d units",
                        values.size(), spec.units.size()));
  }
  for (size_t u = 0; u < spec.units.size(); ++u) {
    if (values[u].size() != spec.units[u].params.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("SetEngineParams: unit %s has %d params of values, the model %d",
                          spec.units[u].name, values[u].size(), spec.units[u].params.size()));
    }
    for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
      if (spec.units[u].params[p].tied_to.has_value()) continue;
      absl::Status s = engine.SetParam(static_cast<int>(u), static_cast<int>(p), values[u][p]);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ParamValues> GetEngineParams(Engine& engine) {
  const ModelSpec& spec = engine.model();
  ParamValues values(spec.units.size());
  for (size_t u = 0; u < spec.units.size(); ++u) {
    values[u].resize(spec.units[u].params.size());
    for (size_t p = 0; p < spec.units[u].params.size(); ++p) {
      if (spec.units[u].params[p].tied_to.has_value()) continue;
      absl::StatusOr<std::vector<float>> v =
          engine.GetParam(static_cast<int>(u), static_cast<int>(p));
      if (!v.ok()) return v.status();
      values[u][p] = *std::move(v);
    }
  }
  return values;
}

}  // namespace zeroshard::gpt
