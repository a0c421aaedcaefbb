// libFuzzer target: bytes as a checkpoint's manifest.json through
// ParseManifestContent (engine/src/checkpoint/format.h; the checksum check
// of ParseManifest comes first and would refuse nearly every mutation).
// Besides "no crash, no sanitizer report, no hang, bounded memory" it checks
// the reader's contract:
//  - an accepted manifest describes files whose sizes the format functions
//    compute without overflow, one per rank, one CRC per unit;
//  - writing it again and reading that back (checksum included) gives the
//    same document: nothing read is lost or changed on the way out.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/src/checkpoint/format.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace zi = zeroshard::internal;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<zi::Manifest> m = zi::ParseManifestContent(text, "manifest.json");
  if (!m.ok()) return 0;
  const size_t units = m->model.units.size();
  ZS_FUZZ_CHECK(units > 0 && m->shard_numel.size() == units && m->used_numel.size() == units,
                "an accepted manifest has no shard size per unit");
  ZS_FUZZ_CHECK(m->files.size() == static_cast<size_t>(m->world_size),
                "an accepted manifest does not list one file per rank");
  const int64_t bytes = zi::FileBytes(m->shard_numel, m->chunk_elements);
  ZS_FUZZ_CHECK(bytes >= zi::kHeaderBytes + zi::kTrailerBytes + zi::DataBytes(*m),
                "the rank-file size overflows");
  for (const zi::FileRecord& f : m->files) {
    ZS_FUZZ_CHECK(f.bytes == bytes && f.unit_crc32c.size() == units,
                  "a file record disagrees with the layout");
  }

  const std::string written = zi::ManifestToJson(*m);
  const absl::StatusOr<zi::Manifest> again = zi::ParseManifest(written, "rewritten");
  ZS_FUZZ_CHECK(again.ok(), "a manifest written from an accepted one is refused");
  ZS_FUZZ_CHECK(zi::ManifestToJson(*again) == written, "a manifest does not survive a round trip");
  return 0;
}
