#include "core/random.h"

#include <ATen/CPUGeneratorImpl.h>

namespace mmtrain {

at::Generator indexed_generator(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return at::make_generator<at::CPUGeneratorImpl>(z ^ (z >> 31));
}

}  // namespace mmtrain
