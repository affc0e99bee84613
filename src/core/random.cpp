#include "core/random.h"

#include <ATen/CPUGeneratorImpl.h>

namespace mmtrain {

uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

at::Generator indexed_generator(uint64_t seed, uint64_t index) {
  return at::make_generator<at::CPUGeneratorImpl>(splitmix64_mix(seed + 0x9E3779B97F4A7C15ULL * (index + 1)));
}

}  // namespace mmtrain
