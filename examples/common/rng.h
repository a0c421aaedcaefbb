// Counter-based random numbers that example programs, benchmarks and tests
// share: one SplitMix64 for the whole tree. A value is a pure function of
// (key, counter), so any rank can produce any sample, parameter element or
// test datum without shared generator state, and a seed gives the same
// numbers on every rank, every run and every platform.
#ifndef ZEROSHARD_EXAMPLES_COMMON_RNG_H_
#define ZEROSHARD_EXAMPLES_COMMON_RNG_H_

#include <cmath>
#include <cstdint>

namespace zeroshard::examples {

// The increment of SplitMix64's state (2^64 / golden ratio, odd).
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ull;

// One step of SplitMix64 (Steele, Lea, Flood 2014) on the state x: add the
// gamma, then the finaliser. A bijective mixer with good avalanche; used as a
// hash of x.
inline uint64_t SplitMix64(uint64_t x) {
  x += kSplitMix64Gamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Output `index` (0-based) of the SplitMix64 sequence whose state starts at
// `seed`, without running the sequence: the state after index + 1 steps is
// seed + (index + 1) * gamma, and SplitMix64 adds the last gamma itself.
inline uint64_t SplitMix64At(uint64_t seed, uint64_t index) {
  return SplitMix64(seed + index * kSplitMix64Gamma);
}

// Derives a stream key from a parent key and a stream index (seed -> unit ->
// param, or seed -> sample id).
inline uint64_t DeriveKey(uint64_t key, uint64_t index) {
  return SplitMix64(key ^ SplitMix64(index + 0x632be59bd9b4e019ull));
}

// Uniform in (0, 1]: 53 random bits, never 0 so that log() is finite.
inline double UniformAt(uint64_t key, uint64_t counter) {
  const uint64_t bits = DeriveKey(key, counter) >> 11;
  return (static_cast<double>(bits) + 1.0) * (1.0 / 9007199254740992.0);
}

// Element `index` of a standard normal stream. Box-Muller turns the pair of
// uniforms (2p, 2p+1) into two normals: the cosine for even indices, the sine
// for odd ones. Computed in double, so the value is the same on every rank.
inline double NormalAt(uint64_t key, uint64_t index) {
  const uint64_t pair = index / 2;
  const double radius = std::sqrt(-2.0 * std::log(UniformAt(key, 2 * pair)));
  const double angle = 6.283185307179586 * UniformAt(key, 2 * pair + 1);
  return (index % 2 == 0) ? radius * std::cos(angle) : radius * std::sin(angle);
}

}  // namespace zeroshard::examples

#endif  // ZEROSHARD_EXAMPLES_COMMON_RNG_H_
