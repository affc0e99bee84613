// "token_file" dataset: a safetensors file with `tokens` int64 [N, S], one sample per row;
// "causal_lm" collator: stacks samples into batch["tokens"] [B, S]. Generic pre-tokenized LM
// data, used by the engine's test model and the benchmarks.
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "data/dataset.h"

namespace mmtrain {
namespace {

class TokenFileDataset : public Dataset {
 public:
  explicit TokenFileDataset(const DataConfig& data) {
    if (!data.dataset_param.contains("path"))
      fail("data.dataset_param.path: required for dataset_type token_file");
    const auto path = data.dataset_param.at("path").get<std::string>();
    SafetensorsFile file(path);
    tokens_ = file.read("tokens");
    if (tokens_.dim() != 2 || tokens_.scalar_type() != at::kLong)
      fail(path, ": 'tokens' must be int64 [N, S], found ", tokens_.scalar_type(), " ", tokens_.sizes());
    if (data.dataset_param.contains("max_samples")) {
      const auto max_samples = data.dataset_param.at("max_samples").get<int64_t>();
      if (max_samples > 0 && max_samples < tokens_.size(0)) tokens_ = tokens_.narrow(0, 0, max_samples);
    }
    if (tokens_.size(0) == 0) fail(path, ": 'tokens' has no samples");
  }
  int64_t size() const override { return tokens_.size(0); }
  Batch get(int64_t index) const override { return {{"tokens", tokens_[index]}}; }

 private:
  at::Tensor tokens_;
};

class CausalLmCollator : public Collator {
 public:
  Batch collate(const std::vector<Batch>& samples, at::Generator&) const override {
    std::vector<at::Tensor> rows;
    for (const auto& s : samples) rows.push_back(batch_get(s, "tokens"));
    return {{"tokens", at::stack(rows)}};
  }
};

}  // namespace

void register_token_file_data() {
  dataset_registry().add("token_file", [](const Config& c) { return std::make_shared<TokenFileDataset>(c.data); });
  collator_registry().add("causal_lm", [](const Config&) { return std::make_shared<CausalLmCollator>(); });
}

}  // namespace mmtrain
