// Per-model hooks for `mmtrain plan` (src/tools/plan.cpp), registered by model_id next to the
// model factory: an analytic estimate of activation memory (which depends on what the model's
// forward saves for backward, so only the model can say), and optionally the parameter table for
// a model whose Module tree is not registered (yet), so its sharded memory can still be planned.
// A model registered in model_registry() is always planned from its real Module tree.
#pragma once
#include "core/registry.h"
#include "fsdp/plan.h"

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

// Activation bytes of one micro-batch on one rank. Layers are the blocks recompute wraps.
struct ActivationEstimate {
  int64_t tokens = 0;                 // tokens in the micro-batch
  int64_t num_layers = 0;
  int64_t layers_full_bytes = 0;      // Σ over layers of everything autograd saves in the layer
  int64_t max_layer_full_bytes = 0;   // the largest single layer: what recompute rebuilds at once
  int64_t layer_inputs_bytes = 0;     // Σ over layers of the block inputs recompute keeps
  int64_t outside_bytes = 0;          // batch, embeddings, heads, loss: outside every layer
  int64_t backward_bytes = 0;         // transient grads while one layer backpropagates
  std::string largest_layer;          // which layer max_layer_full_bytes is
  std::vector<std::pair<std::string, int64_t>> layer_tensors;  // what the largest layer saves
  int64_t without_recompute_bytes() const { return layers_full_bytes + outside_bytes + backward_bytes; }
  int64_t with_recompute_bytes() const {
    return layer_inputs_bytes + max_layer_full_bytes + outside_bytes + backward_bytes;
  }
};

struct ActivationQuery {
  const nlohmann::json& model_config;  // model.config
  int64_t seqlen = 0;                  // tokens per sample
  int64_t micro_batch_size = 1;        // samples per micro-batch
  at::ScalarType param_dtype = at::kFloat;  // the gathered params' dtype
};

struct ModelPlanHooks {
  std::function<ActivationEstimate(const ActivationQuery&)> activations;      // may be empty
  std::function<std::vector<PlanParam>(const nlohmann::json& model_config)> param_shapes;  // may be empty
  int64_t default_seqlen = 0;          // used when `plan` gets no --seqlen; 0 = required
  std::string shapes_note;             // how param_shapes names tensors, for the plan's header
};

Registry<ModelPlanHooks>& model_plan_registry();

}  // namespace mmtrain
