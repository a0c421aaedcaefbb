// Counter-based random numbers for the MLP example: a value is a pure
// function of (key, counter), so any rank can produce any sample or any
// parameter element without shared generator state.
#ifndef ZEROSHARD_EXAMPLES_MLP_INTERNAL_COUNTER_RNG_H_
#define ZEROSHARD_EXAMPLES_MLP_INTERNAL_COUNTER_RNG_H_

#include <cmath>
#include <cstdint>

namespace zeroshard {
namespace mlp {
namespace internal {

// One round of splitmix64 (Steele, Lea, Flood 2014): a bijective mixer with
// good avalanche, used here as a hash.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
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

}  // namespace internal
}  // namespace mlp
}  // namespace zeroshard

#endif  // ZEROSHARD_EXAMPLES_MLP_INTERNAL_COUNTER_RNG_H_
