// "token_file" dataset: a safetensors file with `tokens` int64 [N, S], one sample per row;
// "causal_lm" collator: stacks samples into batch["tokens"] [B, S]. Generic pre-tokenized LM
// data, used by the engine's test model and the benchmarks. `mmtrain fixture tokens` writes such
// a file.
#include "core/cli_command.h"
#include "core/error.h"
#include "core/param_map.h"
#include "data/dataset.h"
#include "io/safetensors.h"

#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

namespace mmtrain {
namespace {

class TokenFileDataset : public Dataset {
 public:
  explicit TokenFileDataset(const DataConfig& data) {
    const ParamMap params(data.dataset_param, "data.dataset_param", "dataset token_file");
    params.check_known_keys({"dataset_type", "path", "max_samples"});
    const auto path = params.get_string("path", "");
    if (path.empty()) fail(params.where("path"), ": required for dataset_type token_file");
    const int64_t max_samples = params.get_int("max_samples", 0);
    if (max_samples < 0) fail(params.where("max_samples"), ": expected >= 0 (0 = all), found ", max_samples);
    SafetensorsFile file(path);
    tokens_ = file.read("tokens");
    if (tokens_.dim() != 2 || tokens_.scalar_type() != at::kLong)
      fail(path, ": 'tokens' must be int64 [N, S], found ", tokens_.scalar_type(), " ", tokens_.sizes());
    if (max_samples > 0 && max_samples < tokens_.size(0)) tokens_ = tokens_.narrow(0, 0, max_samples);
    if (tokens_.size(0) == 0) fail(path, ": 'tokens' has no samples");
  }
  int64_t size() const override { return tokens_.size(0); }
  Batch get(int64_t index) const override { return {{"tokens", tokens_[index]}}; }
  // A causal LM predicts tokens 1.. from 0..S-2: its sequence is one shorter than the row.
  std::optional<int64_t> sample_tokens(int64_t) const override { return tokens_.size(1) - 1; }

 private:
  at::Tensor tokens_;
};

class CausalLmCollator : public Collator {
 public:
  Batch collate(const std::vector<Batch>& samples, std::vector<at::Generator>&) const override {
    std::vector<at::Tensor> rows;
    for (const auto& s : samples) rows.push_back(batch_get(s, "tokens"));
    return {{"tokens", at::stack(rows)}};
  }
};

struct TokensFixture {
  std::string out_path;
  int64_t samples = 256, seq_len = 65, vocab = 128;
  uint64_t seed = 0;
  bool learnable = false;
};

// tokens [samples, seq_len] in [0, vocab): uniform, or (learnable) a noisy affine recurrence
// x[t+1] = (5 x[t] + 3) mod vocab that a model can fit (10 % of positions keep a random token),
// so that a falling loss means training works.
void write_tokens(const TokensFixture& o) {
  if (o.samples <= 0 || o.seq_len < 2 || o.vocab <= 0)
    fail("fixture tokens: need samples > 0, seq_len >= 2, vocab > 0; got ", o.samples, ", ", o.seq_len, ", ", o.vocab);
  auto parent = std::filesystem::path(o.out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  auto tokens = at::randint(0, o.vocab, {o.samples, o.seq_len}, gen, at::kLong);
  if (o.learnable) {
    auto keep_random = at::rand({o.samples, o.seq_len}, gen) < 0.1;
    for (int64_t t = 1; t < o.seq_len; ++t) {
      auto next = (tokens.select(1, t - 1) * 5 + 3).remainder(o.vocab);
      tokens.select(1, t).copy_(at::where(keep_random.select(1, t), tokens.select(1, t), next));
    }
  }
  safetensors_write(o.out_path, {{"tokens", tokens}}, {{"generator", "mmtrain fixture tokens"}});
  std::printf("wrote %s\n", o.out_path.c_str());
}

const DatasetRegistration dataset("token_file", [](const DataConfig& data, const ModelConfig&) {
  return std::make_shared<TokenFileDataset>(data);
});
const CollatorRegistration collator("causal_lm", [](const DataConfig& data, const ModelConfig&) {
  ParamMap(data.loader.collate_param, "data.dataloader_param.collate_param", "collator causal_lm")
      .check_known_keys({"model_name"});
  return std::make_shared<CausalLmCollator>();
});
const CliRegistration fixture(fixture_registry(), 
    "tokens", {"token data: safetensors `tokens` int64 [samples, seq_len] (dataset token_file)", [](CLI::App& cmd) {
      auto o = std::make_shared<TokensFixture>();
      cmd.add_option("--out", o->out_path, "output .safetensors file")->required();
      cmd.add_option("--samples", o->samples, "number of samples")->capture_default_str();
      cmd.add_option("--seq-len", o->seq_len, "tokens per sample (the model sees seq_len - 1)")->capture_default_str();
      cmd.add_option("--vocab", o->vocab, "vocabulary size")->capture_default_str();
      cmd.add_option("--seed", o->seed, "random seed")->capture_default_str();
      cmd.add_flag("--learnable", o->learnable, "noisy affine sequences a model can learn (default: uniform noise)");
      return [o] { write_tokens(*o); };
    }});

}  // namespace
}  // namespace mmtrain
