// A causal language model that generates token by token with a key/value cache (`mmtrain sample`,
// src/sample/token_generation.h). A model implements it beside Model; the caller runs the FSDP
// gathers around each call as it does around forward().
#pragma once
#include "core/batch.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace mmtrain {

class IncrementalDecoder {
 public:
  // Per layer the keys and values of every position so far: [length, kv_heads, head_dim].
  struct Cache {
    std::vector<at::Tensor> keys, values;
    int64_t length = 0;
  };

  virtual ~IncrementalDecoder() = default;
  // Runs one prompt (input_ids [1, S], and pixel_values / image_sizes when it has images) into an
  // empty cache; returns the logits after its last token, [vocab] fp32.
  virtual at::Tensor prefill(const Batch& prompt, Cache& cache) = 0;
  // Runs one more token at position cache.length; returns the logits after it, [vocab] fp32.
  virtual at::Tensor decode(int64_t token, Cache& cache) = 0;
};

}  // namespace mmtrain
