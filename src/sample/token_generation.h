// Generating tokens from a causal language model with a key/value cache (`mmtrain sample mistral3`):
// the prompt once (prefill), then one token at a time, greedy or sampled with temperature and
// top-p, until EOS or max_new_tokens. docs/sampling.md.
#pragma once
#include "core/batch.h"
#include "models/incremental_decoder.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace mmtrain::sample {

struct TokenSampling {
  int64_t max_new_tokens = 256;
  double temperature = 0.0;  // 0: greedy (argmax, the first of equal maxima)
  double top_p = 1.0;        // with temperature > 0: sample from the fewest tokens whose probability reaches top_p
  bool kv_cache = true;      // false: recompute the whole prefix for every token (the reference path)
  // Ids never generated (their logits set to -inf first, as HF's SuppressTokensLogitsProcessor):
  // GRPO suppresses the image tokens, whose count a later forward checks against the images.
  std::vector<int64_t> suppressed;
};

// The next token from logits [V] fp32 (sampling.suppressed set to -inf first): argmax when temperature is 0; otherwise softmax(logits / T)
// cut to the most probable tokens whose cumulative probability reaches top_p (at least one, as HF's
// TopPLogitsWarper), renormalized, one draw from the generator.
int64_t next_token(const at::Tensor& logits, const TokenSampling& sampling, at::Generator& generator);

struct Generation {
  std::vector<int64_t> tokens;     // the generated ids, EOS included when it ended the generation
  std::vector<at::Tensor> logits;  // with keep_logits: each generated token's logits [V]
};

// `run` wraps each decoder call (the caller's FSDP gathers). `others_active(active)` is asked after
// every token with whether this generation still runs and returns whether any rank's does: a
// finished rank keeps stepping on a dummy token, its results dropped, so every rank issues the
// same collectives. Returns when no rank is active.
Generation generate(IncrementalDecoder& decoder, const std::function<at::Tensor(const std::function<at::Tensor()>&)>& run,
                    const Batch& prompt, int64_t eos, const TokenSampling& sampling, at::Generator& generator,
                    bool keep_logits, const std::function<bool(bool)>& others_active);

// The completions of one prompt, one per generator, generated together (GRPO's rollouts): the
// prompt prefilled once and its cache copied for each, then one decoder call per token for all of
// them (IncrementalDecoder::decode_batch). Completion g draws from generators[g] exactly as
// generate() would alone, so it is generate()'s completion whenever the batched call's logits are
// the single call's (the same kernels row by row). A finished completion keeps stepping on its
// last token, its results dropped; `others_active` as for generate().
std::vector<Generation> generate_group(IncrementalDecoder& decoder,
                                       const std::function<at::Tensor(const std::function<at::Tensor()>&)>& run,
                                       const Batch& prompt, int64_t eos, const TokenSampling& sampling,
                                       std::vector<at::Generator>& generators, const std::function<bool(bool)>& others_active);

}  // namespace mmtrain::sample
