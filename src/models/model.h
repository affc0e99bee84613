// What a trainable model is to the trainer: a Module tree whose forward maps a collated Batch to
// a scalar loss, plus the FLOPs that costs. Everything else a model family brings (its HF
// adapter, config inference, FLOPs tool, activation estimate) is in its ModelSpec
// (models/model_spec.h).
#pragma once
#include "core/batch.h"
#include "nn/module.h"

#include <map>
#include <string>

namespace mmtrain {

struct ModelOutput {
  at::Tensor loss;                        // scalar fp32, mean over this micro-batch
  int64_t tokens = 0;                     // tokens processed (for throughput)
  std::map<std::string, double> metrics;  // extra loss terms for the log line
  std::map<std::string, at::Tensor> tensors;  // named outputs for debugging ("prediction")
};

class Model : public Module {
 public:
  virtual ModelOutput forward(const Batch& batch) = 0;
  // Model FLOPs of forward + backward on this batch (convention in docs/flops.md); 0 = unknown.
  virtual double train_flops(const Batch& batch) const { return 0.0; }
};

}  // namespace mmtrain
