#include "tools/fixture.h"

#include "checkpoint/safetensors.h"
#include "core/error.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>

namespace mmtrain {

void fixture_tokens(const std::string& out_path, int64_t samples, int64_t seq_len, int64_t vocab, uint64_t seed,
                    bool learnable) {
  if (samples <= 0 || seq_len < 2 || vocab <= 0)
    fail("fixture tokens: need samples > 0, seq_len >= 2, vocab > 0; got ", samples, ", ", seq_len, ", ", vocab);
  auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto tokens = at::randint(0, vocab, {samples, seq_len}, gen, at::kLong);
  if (learnable) {
    // x[t+1] = (5 x[t] + 3) mod vocab, except where a 10 % noise mask keeps the random token:
    // a model can learn it, so a falling loss means training works.
    auto keep_random = at::rand({samples, seq_len}, gen) < 0.1;
    for (int64_t t = 1; t < seq_len; ++t) {
      auto next = (tokens.select(1, t - 1) * 5 + 3).remainder(vocab);
      tokens.select(1, t).copy_(at::where(keep_random.select(1, t), tokens.select(1, t), next));
    }
  }
  safetensors_write(out_path, {{"tokens", tokens}}, {{"generator", "mmtrain fixture tokens"}});
}

}  // namespace mmtrain
