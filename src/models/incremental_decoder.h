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
  // Per layer the keys and values of every position so far: [length, kv_heads, head_dim]; after
  // expand_cache, [sequences, length, kv_heads, head_dim].
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
  // Runs one more token for each of B sequences that went on from one prompt (a cache made by
  // expand_cache, all at cache.length), in one call; returns the logits after each, [B, vocab] fp32.
  virtual at::Tensor decode_batch(const std::vector<int64_t>& tokens, Cache& cache) = 0;

  // A prefilled cache copied for `copies` sequences that each go on from the prompt.
  static void expand_cache(Cache& cache, int64_t copies) {
    for (auto* per_layer : {&cache.keys, &cache.values})
      for (auto& t : *per_layer) t = t.unsqueeze(0).expand({copies, t.size(0), t.size(1), t.size(2)}).contiguous();
  }
};

}  // namespace mmtrain
