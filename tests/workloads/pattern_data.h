// Deterministic all-reduce inputs: every rank can compute every other rank's input, so every
// received byte (partial sums during reduce-scatter, final sums during all-gather) is checked
// exactly. Unsigned 64-bit sums wrap, so they are exact whatever the values.
#pragma once

#include <cstdint>

namespace nccl_pattern {

inline uint64_t mix64(uint64_t x) {  // splitmix64 finaliser: cheap, well spread
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t input_value(uint64_t seed, int rank, int iter, uint64_t element) {
  return mix64(seed ^ mix64((static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(iter) << 32) ^ element));
}

// Sum of the inputs of ranks first, first-1, ..., first-(count-1) (mod nranks) at one element.
inline uint64_t partial_sum(uint64_t seed, int nranks, int first, int count, int iter, uint64_t element) {
  uint64_t sum = 0;
  for (int j = 0; j < count; ++j) sum += input_value(seed, ((first - j) % nranks + nranks) % nranks, iter, element);
  return sum;
}

}  // namespace nccl_pattern
