#include "engine/src/checkpoint/safetensors.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/src/common/checked_math.h"
#include "nlohmann/json.hpp"
#include "zeroshard/dtype.h"
#include "zeroshard/status.h"

namespace zeroshard::internal {
namespace {

using nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr int64_t kLengthPrefixBytes = 8;
constexpr char kKnownDtypes[] = "F32, BF16, F16";

// Bytes per element of a safetensors dtype zeroshard stores, or nullopt.
std::optional<int64_t> DtypeBytes(absl::string_view dtype) {
  if (dtype == "F32") return static_cast<int64_t>(DTypeSize(DType::kFloat32));
  if (dtype == "BF16") return static_cast<int64_t>(DTypeSize(DType::kBFloat16));
  if (dtype == "F16") return static_cast<int64_t>(DTypeSize(DType::kFloat16));
  return std::nullopt;
}

// Bytes of a tensor (dims >= 0), or nullopt past 2^63 - 1.
std::optional<int64_t> TensorBytes(const std::vector<int64_t>& shape, int64_t element_bytes) {
  CheckedInt64 bytes = element_bytes;
  for (const int64_t dim : shape) bytes *= dim;
  return bytes.value();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A string as a JSON string literal: quoted and escaped, so that names with
// quotes or control characters read unambiguously in messages and headers.
// Invalid UTF-8 (only possible before validation) becomes U+FFFD rather than
// an exception.
std::string Quote(absl::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// A JSON value for an error message, cut short: a field may be megabytes.
std::string Describe(const json& v) {
  constexpr size_t kMaxChars = 60;
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxChars) text = absl::StrCat(text.substr(0, kMaxChars), "...");
  return text;
}

// Well-formed UTF-8 as RFC 3629 defines it (what JSON requires): no overlong
// forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    int continuation = 0;
    unsigned char low = 0x80, high = 0xBF;  // range of the second byte
    if (lead < 0x80) {
      ++i;
      continue;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      continuation = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      continuation = 2;
      if (lead == 0xE0) low = 0xA0;   // overlong below U+0800
      if (lead == 0xED) high = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      continuation = 3;
      if (lead == 0xF0) low = 0x90;   // overlong below U+10000
      if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
    } else {
      return false;  // a continuation byte, an overlong C0/C1 lead, or F5..FF
    }
    if (s.size() - i <= static_cast<size_t>(continuation)) return false;
    for (int k = 1; k <= continuation; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < (k == 1 ? low : 0x80) || c > (k == 1 ? high : 0xBF)) return false;
    }
    i += continuation + 1;
  }
  return true;
}

// A first pass over a header's JSON that builds nothing and stops at the
// first problem: a syntax error; nesting deeper than safetensors uses (header
// object > tensor object > shape array), so that the tree built afterwards is
// small whatever the input; a key twice in one object, which a JSON object
// would silently merge (last one wins), so that two readers could see two
// different files. (nlohmann's parser callback could find the last two while
// building the tree, but its bookkeeping makes it quadratic in the number of
// tensors.)
class HeaderStructureCheck final : public nlohmann::json_sax<json> {
 public:
  // What stopped the parse, for "the header ..." in an error message.
  const std::string& problem() const { return problem_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }

  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return Enter();
  }
  bool key(string_t& key) override {
    if (keys_.back().insert(key).second) return true;
    problem_ = absl::StrCat("has the key ", Quote(key), " twice in one object");
    return false;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return Enter(); }
  bool end_array() override {
    --depth_;
    return true;
  }

  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& error) override {
    constexpr size_t kMaxChars = 200;  // the message quotes the input read so far
    std::string what = error.what();
    if (what.size() > kMaxChars) what = absl::StrCat(what.substr(0, kMaxChars), "...");
    problem_ = absl::StrCat("is not valid JSON (", what, ")");
    return false;
  }

 private:
  static constexpr int kMaxDepth = 3;

  bool Enter() {
    if (++depth_ <= kMaxDepth) return true;
    problem_ =
        "nests objects or arrays deeper than safetensors does (a shape inside a tensor inside "
        "the header)";
    return false;
  }

  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;  // of each open object
  std::string problem_;
};

absl::Status CheckTensorToWrite(const SafetensorsTensor& t, size_t index,
                                const std::map<std::string, size_t>& earlier) {
  if (t.name.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SafetensorsHeader: tensor %d has an empty name; give every tensor a name", index));
  }
  if (t.name == kMetadataKey) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SafetensorsHeader: tensor %d is named \"%s\", the key safetensors reserves for the "
        "metadata; rename the tensor",
        index, kMetadataKey));
  }
  if (!IsValidUtf8(t.name)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SafetensorsHeader: tensor %d's name %s is not valid UTF-8 (the header is JSON); "
        "name tensors with UTF-8 text",
        index, Quote(t.name)));
  }
  if (const auto it = earlier.find(t.name); it != earlier.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SafetensorsHeader: tensors %d and %d are both named %s; names must be "
                        "unique in a file",
                        it->second, index, Quote(t.name)));
  }
  if (!DtypeBytes(t.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SafetensorsHeader: tensor %s: dtype %s is not one of %s", Quote(t.name),
                        Quote(t.dtype), kKnownDtypes));
  }
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SafetensorsHeader: tensor %s: dimension %d of shape %s is %d; dimensions must be "
          "positive",
          Quote(t.name), d, ShapeString(t.shape), t.shape[d]));
    }
  }
  return absl::OkStatus();
}

// Checks that the header SafetensorsHeader built reads back as what it was
// built from. A failure is a bug here, not in the caller's input.
absl::Status CheckReadsBack(const std::string& header, int64_t data_bytes,
                            const std::vector<SafetensorsTensor>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  const std::optional<int64_t> file_size =
      CheckedAdd(static_cast<int64_t>(header.size()), data_bytes);
  if (!file_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SafetensorsHeader: the file (a %d-byte header and %d bytes of data) would be past "
        "2^63 - 1 bytes; store fewer or smaller tensors per file",
        header.size(), data_bytes));
  }
  const absl::StatusOr<SafetensorsIndex> index =
      ParseSafetensorsHeader(header, *file_size, "the header SafetensorsHeader wrote");
  bool same = index.ok() && index->data_start == static_cast<int64_t>(header.size()) &&
              index->metadata == metadata && index->tensors.size() == tensors.size();
  int64_t offset = 0;
  for (size_t i = 0; same && i < tensors.size(); ++i) {
    const SafetensorsEntry& e = index->tensors[i];
    same = e.name == tensors[i].name && e.dtype == tensors[i].dtype &&
           e.shape == tensors[i].shape && e.begin == offset;
    offset = e.end;
  }
  if (!same) {
    return absl::InternalError(absl::StrCat(
        "SafetensorsHeader: the header written does not read back as the tensors given (a bug "
        "in zeroshard's safetensors writer; please report it)",
        index.ok() ? "" : absl::StrCat(": ", index.status().message())));
  }
  return absl::OkStatus();
}

// An integer field as int64_t in [0, 2^63 - 1], or nullopt.
std::optional<int64_t> NonNegativeInt64(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  return std::nullopt;
}

// Reads one tensor's JSON object into `entry` (name already set).
absl::Status ReadTensorEntry(const json& value, absl::string_view source, SafetensorsEntry* entry) {
  const std::string where = absl::StrCat(source, ": tensor ", Quote(entry->name));
  if (entry->name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a tensor has an empty name; the file is not one zeroshard reads"));
  }
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is ", Describe(value),
                     "; it must be an object with fields dtype, shape and data_offsets"));
  }
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown field ", Quote(key),
                       "; a tensor has only dtype, shape and data_offsets"));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field '", field, "' is missing; it is required"));
    }
  }

  const json& dtype = value.at("dtype");
  if (!dtype.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'dtype' is ", Describe(dtype), "; it must be a string"));
  }
  entry->dtype = dtype.get<std::string>();
  const std::optional<int64_t> element_bytes = DtypeBytes(entry->dtype);
  if (!element_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": dtype ", Quote(entry->dtype),
                                                   " is not one of ", kKnownDtypes,
                                                   " (the dtypes zeroshard stores)"));
  }

  const json& shape = value.at("shape");
  if (!shape.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field 'shape' is ", Describe(shape),
                                                   "; it must be an array of integers >= 0"));
  }
  for (const json& dim : shape) {
    const std::optional<int64_t> d = NonNegativeInt64(dim);
    if (!d) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field 'shape' holds ", Describe(dim),
                       "; dimensions must be integers in [0, 2^63 - 1]"));
    }
    entry->shape.push_back(*d);
  }

  const json& offsets = value.at("data_offsets");
  const bool pair = offsets.is_array() && offsets.size() == 2;
  const std::optional<int64_t> begin = pair ? NonNegativeInt64(offsets[0]) : std::nullopt;
  const std::optional<int64_t> end = pair ? NonNegativeInt64(offsets[1]) : std::nullopt;
  if (!begin || !end || *begin > *end) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'data_offsets' is ", Describe(offsets),
                     "; it must be [begin, end] with integers 0 <= begin <= end < 2^63"));
  }
  entry->begin = *begin;
  entry->end = *end;

  const std::optional<int64_t> bytes = TensorBytes(entry->shape, *element_bytes);
  if (!bytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": shape ", ShapeString(entry->shape),
                                                   " of ", entry->dtype,
                                                   " is past 2^63 - 1 bytes; the file is damaged"));
  }
  if (*bytes != *end - *begin) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: shape %s of %s is %d bytes, but data_offsets [%d, %d] hold %d; the header is "
        "damaged or was written for another shape",
        where, ShapeString(entry->shape), entry->dtype, *bytes, *begin, *end, *end - *begin));
  }
  return absl::OkStatus();
}

absl::Status ReadMetadata(const json& value, absl::string_view source,
                          std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field '", kMetadataKey, "' is ",
                                                   Describe(value),
                                                   "; it must be an object of strings"));
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", kMetadataKey, " entry ",
                                                     Quote(key), " is ", Describe(v),
                                                     "; metadata values must be strings"));
    }
    (*metadata)[key] = v.get<std::string>();
  }
  return absl::OkStatus();
}

// The data ranges, sorted, must tile [0, data_bytes): each starts where the
// previous one ended, and the last ends at data_bytes.
absl::Status CheckRangesTile(const std::vector<SafetensorsEntry>& tensors, int64_t data_bytes,
                             absl::string_view source) {
  for (const SafetensorsEntry& e : tensors) {
    if (e.end > data_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tensor %s: data_offsets [%d, %d] run past the end of the data (%d bytes); the "
          "file is truncated or its header damaged",
          source, Quote(e.name), e.begin, e.end, data_bytes));
    }
  }
  int64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : tensors) {
    if (e.begin < covered) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tensor %s: data_offsets [%d, %d] overlap those of tensor %s [%d, %d]; the header "
          "is damaged",
          source, Quote(e.name), e.begin, e.end, Quote(previous->name), previous->begin,
          previous->end));
    }
    if (e.begin > covered) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: bytes [%d, %d) of the data belong to no tensor (%s); the header is damaged", source,
          covered, e.begin,
          previous == nullptr
              ? absl::StrCat("before tensor ", Quote(e.name))
              : absl::StrCat("between tensors ", Quote(previous->name), " and ", Quote(e.name))));
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != data_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: bytes [%d, %d) of the data belong to no tensor (after the last one); the header is "
        "damaged or data was appended",
        source, covered, data_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  std::string text = "{";
  if (!metadata.empty()) {
    absl::StrAppend(&text, Quote(kMetadataKey), ":{");
    const char* separator = "";
    for (const auto& [key, value] : metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "SafetensorsHeader: metadata entry %s: %s is not valid UTF-8 (the header is JSON); "
            "store text, or encode bytes (e.g. hex)",
            Quote(key), IsValidUtf8(key) ? "its value" : "its key"));
      }
      absl::StrAppend(&text, separator, Quote(key), ":", Quote(value));
      separator = ",";
    }
    absl::StrAppend(&text, "}");
  }

  std::map<std::string, size_t> index_of_name;
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor& t = tensors[i];
    ZS_RETURN_IF_ERROR(CheckTensorToWrite(t, i, index_of_name));
    index_of_name.emplace(t.name, i);
    const std::optional<int64_t> bytes = TensorBytes(t.shape, *DtypeBytes(t.dtype));
    const std::optional<int64_t> end = bytes ? CheckedAdd(offset, *bytes) : std::nullopt;
    if (!end) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SafetensorsHeader: tensor %s (shape %s of %s) takes the data past 2^63 - 1 bytes; "
          "store fewer or smaller tensors per file",
          Quote(t.name), ShapeString(t.shape), t.dtype));
    }
    absl::StrAppend(&text, i == 0 && metadata.empty() ? "" : ",", Quote(t.name),
                    ":{\"dtype\":", Quote(t.dtype), ",\"shape\":[", absl::StrJoin(t.shape, ","),
                    "],\"data_offsets\":[", offset, ",", *end, "]}");
    offset = *end;
  }
  absl::StrAppend(&text, "}");

  // Spaces (JSON whitespace, as the reference writer pads) up to a multiple of
  // 8 bytes with the length prefix, so the data, and so every tensor of
  // these 2- and 4-byte dtypes, is aligned for its element type once mapped.
  text.append((8 - (kLengthPrefixBytes + text.size()) % 8) % 8, ' ');
  if (static_cast<int64_t>(text.size()) > kSafetensorsMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SafetensorsHeader: the header of %d tensors is %d bytes, past the %d-byte limit "
        "safetensors readers accept; store fewer tensors per file",
        tensors.size(), text.size(), kSafetensorsMaxHeaderBytes));
  }
  std::string header(kLengthPrefixBytes, '\0');
  uint64_t length = text.size();
  for (int64_t i = 0; i < kLengthPrefixBytes; ++i, length >>= 8) {
    header[i] = static_cast<char>(length & 0xff);
  }
  header += text;
  ZS_RETURN_IF_ERROR(CheckReadsBack(header, offset, tensors, metadata));
  return header;
}

absl::StatusOr<int64_t> SafetensorsHeaderSize(absl::string_view prefix, int64_t file_size,
                                              absl::string_view source) {
  if (file_size < kLengthPrefixBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the file is %d bytes, too short for the 8-byte header length; it is not a "
        "safetensors file, or it is truncated",
        source, file_size));
  }
  if (prefix.size() < static_cast<size_t>(kLengthPrefixBytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes given, but the header length needs the file's first 8; read them first",
        source, prefix.size()));
  }
  uint64_t length = 0;
  for (int i = kLengthPrefixBytes - 1; i >= 0; --i) {
    length = (length << 8) | static_cast<unsigned char>(prefix[i]);
  }
  if (length > static_cast<uint64_t>(kSafetensorsMaxHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: header length %d is past the %d-byte limit of safetensors headers; the file is "
        "damaged or not a safetensors file",
        source, length, kSafetensorsMaxHeaderBytes));
  }
  if (static_cast<int64_t>(length) > file_size - kLengthPrefixBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: header length %d runs past the end of the file (%d bytes); the file is truncated "
        "or damaged",
        source, length, file_size));
  }
  return kLengthPrefixBytes + static_cast<int64_t>(length);
}

absl::StatusOr<SafetensorsIndex> ParseSafetensorsHeader(absl::string_view head, int64_t file_size,
                                                        absl::string_view source) {
  ZS_ASSIGN_OR_RETURN(const int64_t header_size, SafetensorsHeaderSize(head, file_size, source));
  if (head.size() < static_cast<size_t>(header_size)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes of the file given, but its header is %d bytes (8 + %d); read the first %d",
        source, head.size(), header_size, header_size - kLengthPrefixBytes, header_size));
  }
  const absl::string_view text = head.substr(kLengthPrefixBytes, header_size - kLengthPrefixBytes);
  if (text.empty() || text.front() != '{') {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the header does not start with '{'%s; it is not a safetensors file, or it is "
        "damaged",
        source,
        text.empty() ? " (it is empty)"
                     : absl::StrFormat(" (its first byte is 0x%02x)",
                                       static_cast<unsigned char>(text.front()))));
  }

  HeaderStructureCheck structure;
  if (!json::sax_parse(text.begin(), text.end(), &structure)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the header ", structure.problem(),
                     "; the file is damaged or not a safetensors file"));
  }
  const json doc =
      json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {  // HeaderStructureCheck let it through
    return absl::InternalError(absl::StrCat(
        source,
        ": the header passed the structure check but does not parse as an object (a bug "
        "in zeroshard's safetensors reader; please report it)"));
  }

  SafetensorsIndex index;
  index.data_start = header_size;
  for (const auto& [key, value] : doc.items()) {
    if (key == kMetadataKey) {
      ZS_RETURN_IF_ERROR(ReadMetadata(value, source, &index.metadata));
      continue;
    }
    SafetensorsEntry entry;
    entry.name = key;
    ZS_RETURN_IF_ERROR(ReadTensorEntry(value, source, &entry));
    index.tensors.push_back(std::move(entry));
  }
  std::sort(index.tensors.begin(), index.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  ZS_RETURN_IF_ERROR(CheckRangesTile(index.tensors, file_size - header_size, source));
  return index;
}

}  // namespace zeroshard::internal
