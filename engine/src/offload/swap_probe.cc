// SwapFileProbe (zeroshard/offload.h): sequential passes over swap files.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/src/offload/swap_files.h"
#include "zeroshard/offload.h"
#include "zeroshard/status.h"

namespace zeroshard {
namespace {

class SwapFileProbeImpl final : public SwapFileProbe {
 public:
  SwapFileProbeImpl(std::unique_ptr<internal::SwapFiles> files, internal::AlignedBuffer buf,
                    int64_t chunk_bytes, int in_flight)
      : files_(std::move(files)),
        buf_(std::move(buf)),
        chunk_bytes_(chunk_bytes),
        in_flight_(in_flight) {}

  absl::StatusOr<double> Pass(bool write) override {
    double seconds = 0;
    for (int t = 0; t < files_->num_tensors(); ++t) {
      ZS_ASSIGN_OR_RETURN(const double s,
                          internal::MeasureSequentialSeconds(*files_, t, buf_.data(), chunk_bytes_,
                                                             write, in_flight_));
      seconds += s;
    }
    return seconds;
  }
  int64_t bytes() const override {
    int64_t total = 0;
    for (int t = 0; t < files_->num_tensors(); ++t) total += files_->rounded_bytes(t);
    return total;
  }
  std::string Describe() const override { return files_->describe(); }

 private:
  std::unique_ptr<internal::SwapFiles> files_;
  internal::AlignedBuffer buf_;
  int64_t chunk_bytes_;
  int in_flight_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SwapFileProbe>> SwapFileProbe::Create(
    const std::string& dir, const std::vector<int64_t>& bytes, int64_t chunk_bytes, int in_flight,
    int rank, bool verify) {
  if (chunk_bytes <= 0 || chunk_bytes % internal::kSwapAlignment != 0 || in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SwapFileProbe: chunk_bytes %d must be a positive multiple of %d and in_flight %d >= 1",
        chunk_bytes, internal::kSwapAlignment, in_flight));
  }
  std::vector<internal::SwapTensor> tensors;
  for (size_t i = 0; i < bytes.size(); ++i) tensors.push_back({absl::StrCat("probe", i), bytes[i]});
  internal::SwapOptions options;
  options.dir = dir;
  options.rank = rank;
  options.verify = verify;
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<internal::SwapFiles> files,
                      internal::SwapFiles::Create(options, tensors));
  ZS_ASSIGN_OR_RETURN(internal::AlignedBuffer buf,
                      internal::AlignedBuffer::Allocate(chunk_bytes * in_flight));
  // Never zeros: a file system may treat zero pages specially.
  unsigned char* p = static_cast<unsigned char*>(buf.data());
  for (int64_t i = 0; i < buf.size(); ++i) p[i] = static_cast<unsigned char>(0x3c + i * 131);
  return std::unique_ptr<SwapFileProbe>(
      new SwapFileProbeImpl(std::move(files), std::move(buf), chunk_bytes, in_flight));
}

}  // namespace zeroshard
