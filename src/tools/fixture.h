// `mmtrain fixture ...`: generates the data and weights tests, benchmarks and the demo use, so
// nothing is ever downloaded.
#pragma once
#include <cstdint>
#include <string>

namespace mmtrain {

// tokens.safetensors with `tokens` int64 [samples, seq_len] in [0, vocab): uniform, or (learnable)
// a noisy affine recurrence a model can fit.
void fixture_tokens(const std::string& out_path, int64_t samples, int64_t seq_len, int64_t vocab, uint64_t seed,
                    bool learnable);

}  // namespace mmtrain
