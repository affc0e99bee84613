// Counter-based randomness: the values of item `index` (a sample, a tensor, an epoch's order)
// depend on (seed, index) only, never on how many items come before it or how they are sharded.
#pragma once
#include <ATen/core/Generator.h>

#include <cstdint>

namespace mmtrain {

// splitmix64's output function: a bijection of 64-bit words whose outputs for nearby inputs
// look unrelated.
uint64_t splitmix64_mix(uint64_t z);

// A CPU generator seeded by splitmix64 of (seed, index).
at::Generator indexed_generator(uint64_t seed, uint64_t index);

}  // namespace mmtrain
