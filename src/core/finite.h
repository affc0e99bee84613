// Where a floating-point tensor first holds NaN or ±Inf. The trainer checks the weights and
// AdamW moments after every step, and every tensor before a checkpoint is written, so that a
// diverged step stops the run instead of being saved.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace mmtrain {

// Flat index (row-major) of the first NaN/Inf element of t; -1 when every element is finite or
// t is not a floating-point tensor. One pass over t's bytes for a contiguous fp32 CPU tensor
// (the shards and moments), ATen's isfinite otherwise.
int64_t first_non_finite(const at::Tensor& t);

}  // namespace mmtrain
