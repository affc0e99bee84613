// What a trainable model is to the trainer: a Module tree whose forward maps a collated Batch
// to a scalar loss, plus the FLOPs it costs. Models register a factory by model_id.
#pragma once
#include "core/registry.h"
#include "nn/module.h"

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

namespace mmtrain {

// Named tensors from a collator (the seeds' batch keys: input_ids, x, cu_seqlens, ...).
using Batch = std::map<std::string, at::Tensor>;

struct ModelOutput {
  at::Tensor loss;                        // scalar fp32, mean over this micro-batch
  int64_t tokens = 0;                     // tokens processed (for throughput)
  std::map<std::string, double> metrics;  // extra loss terms for the log line
  std::map<std::string, at::Tensor> tensors;  // named outputs for debugging ("prediction")
};

// read(key, row_begin, row_end): rows of a tensor as stored in an HF checkpoint.
using HfRowReader = std::function<at::Tensor(const std::string& key, int64_t row_begin, int64_t row_end)>;

class Model : public Module {
 public:
  virtual ModelOutput forward(const Batch& batch) = 0;
  // Model FLOPs of forward + backward on this batch (convention in docs/flops.md); 0 = unknown.
  virtual double train_flops(const Batch& batch) const { return 0.0; }

  // The IO boundary with the public HF layout (torchtitan's state_dict_adapter): the model keeps
  // its own names and row layouts inside; these translate at load and export only.
  // HF key of a parameter; default: its own name.
  virtual std::string hf_key(const std::string& param_name) const { return param_name; }
  // Older HF names the loader also accepts for a parameter when hf_key is absent from the
  // checkpoint (e.g. pre-4.52 transformers prefixes); export always writes hf_key.
  virtual std::vector<std::string> hf_key_aliases(const std::string& param_name) const { return {}; }
  // Whether the parameter's rows are re-laid out between HF and training (gated-MLP halves).
  virtual bool hf_layout_differs(const std::string& param_name) const { return false; }
  // Rows [begin, end) of the parameter in the training layout, read from the HF tensor.
  virtual at::Tensor hf_load_rows(const std::string& param_name, int64_t begin, int64_t end,
                                  const HfRowReader& read) const {
    return read(hf_key(param_name), begin, end);
  }
  // The full parameter converted back to the HF layout (the inverse of hf_load_rows).
  virtual at::Tensor to_hf_layout(const std::string& param_name, const at::Tensor& full) const { return full; }
  // How many parameters hf_layout_differs for under this config (a loader checks it converted
  // exactly that many); 0 when the model has no layout transform.
  virtual int64_t expected_layout_conversions() const { return 0; }
};

// Builds a model from model.config (dimensions) for compute in compute_dtype. Parameters are
// shapes only: nothing is allocated until FSDP shards them.
using ModelFactory = std::function<std::shared_ptr<Model>(const nlohmann::json& model_config)>;

Registry<ModelFactory>& model_registry();

// The key a Batch entry or config field must have; fails naming the key when it is missing.
const at::Tensor& batch_get(const Batch& batch, const std::string& key);

}  // namespace mmtrain
