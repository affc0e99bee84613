#include "sample/token_generation.h"

#include "core/error.h"

#include <cmath>
#include <limits>

namespace mmtrain::sample {

int64_t next_token(const at::Tensor& given_logits, const TokenSampling& sampling, at::Generator& generator) {
  at::Tensor logits = given_logits;
  if (!sampling.suppressed.empty())
    logits = logits.index_fill(0, at::tensor(sampling.suppressed, at::kLong).to(logits.device()),
                               -std::numeric_limits<float>::infinity());
  if (sampling.temperature == 0.0) return logits.argmax().item<int64_t>();
  if (!(sampling.temperature > 0 && std::isfinite(sampling.temperature)))
    fail("sampling temperature must be >= 0 and finite, found ", sampling.temperature);
  if (!(sampling.top_p > 0 && sampling.top_p <= 1)) fail("sampling top_p must be in (0, 1], found ", sampling.top_p);
  const at::Tensor probs = at::softmax(logits.to(at::kFloat) / sampling.temperature, 0);
  const auto [sorted, order] = probs.sort(/*dim=*/0, /*descending=*/true);
  // Keep token k while the probability before it is below top_p: the fewest reaching top_p.
  const at::Tensor before = sorted.cumsum(0) - sorted;
  const at::Tensor kept = at::where(before < sampling.top_p, sorted, at::zeros_like(sorted));
  const at::Tensor choice = at::multinomial(kept / kept.sum(), 1, /*replacement=*/false, generator);
  return order[choice.item<int64_t>()].item<int64_t>();
}

Generation generate(IncrementalDecoder& decoder, const std::function<at::Tensor(const std::function<at::Tensor()>&)>& run,
                    const Batch& prompt, int64_t eos, const TokenSampling& sampling, at::Generator& generator,
                    bool keep_logits, const std::function<bool(bool)>& others_active) {
  if (sampling.max_new_tokens < 1) fail("max_new_tokens must be >= 1, found ", sampling.max_new_tokens);
  Generation out;
  IncrementalDecoder::Cache cache;
  const at::Tensor prompt_ids = prompt.at("input_ids");
  // The reference path: the prompt and every token so far through the model again.
  auto whole_prefix = [&] {
    Batch again = prompt;
    if (!out.tokens.empty())
      again["input_ids"] = at::cat({prompt_ids, at::tensor(out.tokens, at::kLong).view({1, -1})}, 1);
    IncrementalDecoder::Cache fresh;
    return decoder.prefill(again, fresh);
  };
  at::Tensor logits = run([&] { return decoder.prefill(prompt, cache); });
  bool active = true;
  while (true) {
    if (active) {
      const int64_t token = next_token(logits, sampling, generator);
      out.tokens.push_back(token);
      if (keep_logits) out.logits.push_back(logits);
      active = token != eos && static_cast<int64_t>(out.tokens.size()) < sampling.max_new_tokens;
    }
    if (!others_active(active)) break;
    const int64_t feed = out.tokens.back();  // a finished rank repeats its last token, unused
    logits = sampling.kv_cache ? run([&] { return decoder.decode(feed, cache); }) : run(whole_prefix);
  }
  return out;
}

std::vector<Generation> generate_group(IncrementalDecoder& decoder,
                                       const std::function<at::Tensor(const std::function<at::Tensor()>&)>& run,
                                       const Batch& prompt, int64_t eos, const TokenSampling& sampling,
                                       std::vector<at::Generator>& generators, const std::function<bool(bool)>& others_active) {
  if (sampling.max_new_tokens < 1) fail("max_new_tokens must be >= 1, found ", sampling.max_new_tokens);
  const auto count = static_cast<int64_t>(generators.size());
  if (count < 1) fail("generate_group: no generator");
  IncrementalDecoder::Cache cache;
  const at::Tensor first = run([&] { return decoder.prefill(prompt, cache); });  // [V]: every completion's first logits
  IncrementalDecoder::expand_cache(cache, count);
  std::vector<Generation> out(static_cast<size_t>(count));
  std::vector<bool> active(static_cast<size_t>(count), true);
  for (at::Tensor logits;;) {  // [count, V] after the first token
    bool any = false;
    for (int64_t g = 0; g < count; ++g) {
      if (!active[g]) continue;
      auto& tokens = out[g].tokens;
      tokens.push_back(next_token(logits.defined() ? logits[g] : first, sampling, generators[g]));
      active[g] = tokens.back() != eos && static_cast<int64_t>(tokens.size()) < sampling.max_new_tokens;
      any = any || active[g];
    }
    if (!others_active(any)) return out;
    std::vector<int64_t> feed;  // a finished completion repeats its last token
    for (const auto& generation : out) feed.push_back(generation.tokens.back());
    logits = run([&] { return decoder.decode_batch(feed, cache); });
  }
}

}  // namespace mmtrain::sample
