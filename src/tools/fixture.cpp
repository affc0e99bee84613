#include "tools/fixture.h"

#include "checkpoint/safetensors.h"
#include "core/error.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>

namespace mmtrain {

void fixture_tokens(const std::string& out_path, int64_t samples, int64_t seq_len, int64_t vocab, uint64_t seed) {
  if (samples <= 0 || seq_len < 2 || vocab <= 0)
    fail("fixture tokens: need samples > 0, seq_len >= 2, vocab > 0; got ", samples, ", ", seq_len, ", ", vocab);
  auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto tokens = at::randint(0, vocab, {samples, seq_len}, gen, at::kLong);
  safetensors_write(out_path, {{"tokens", tokens}}, {{"generator", "mmtrain fixture tokens"}});
}

}  // namespace mmtrain
