// Counter-based generators for fixtures: the values of item `index` (a sample, a tensor) depend
// on (seed, index) only, never on how many items come before it or how they are sharded.
#pragma once
#include <ATen/core/Generator.h>

#include <cstdint>

namespace mmtrain {

// A CPU generator seeded by splitmix64 of (seed, index).
at::Generator indexed_generator(uint64_t seed, uint64_t index);

}  // namespace mmtrain
