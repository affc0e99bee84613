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
};

class Model : public Module {
 public:
  virtual ModelOutput forward(const Batch& batch) = 0;
  // Model FLOPs of forward + backward on this batch (convention in docs/flops.md); 0 = unknown.
  virtual double train_flops(const Batch& batch) const { return 0.0; }
};

// Builds a model from model.config (dimensions) for compute in compute_dtype. Parameters are
// shapes only: nothing is allocated until FSDP shards them.
using ModelFactory = std::function<std::shared_ptr<Model>(const nlohmann::json& model_config)>;

Registry<ModelFactory>& model_registry();

// The key a Batch entry or config field must have; fails naming the key when it is missing.
const at::Tensor& batch_get(const Batch& batch, const std::string& key);

}  // namespace mmtrain
