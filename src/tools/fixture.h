// `mmtrain fixture ...`: generates the data and weights tests, benchmarks and the demo use, so
// nothing is ever downloaded.
#pragma once
#include <cstdint>
#include <string>

namespace mmtrain {

// tokens.safetensors with `tokens` int64 [samples, seq_len] uniform in [0, vocab).
void fixture_tokens(const std::string& out_path, int64_t samples, int64_t seq_len, int64_t vocab, uint64_t seed);

}  // namespace mmtrain
