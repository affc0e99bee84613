// What `mmtrain plan` asks a model about activations: the bytes one micro-batch keeps for
// backward on one rank, split so that the plan can show them with and without recompute. Only
// the model can say, since it depends on what its forward saves.
#pragma once
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

// Layers are the blocks recompute wraps.
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
  int64_t q_width = 0;                // attention query heads x head_dim (context-parallel buffers)
  int64_t kv_width = 0;               // attention KV heads x head_dim
  int64_t without_recompute_bytes() const { return layers_full_bytes + outside_bytes + backward_bytes; }
  // A forward under no-grad (an evaluation's, a sampler's) frees each layer's tensors as it
  // goes: one layer's working set at a time, plus what lies outside the layers.
  int64_t forward_only_bytes() const { return max_layer_full_bytes + outside_bytes; }
  int64_t with_recompute_bytes() const {
    return layer_inputs_bytes + max_layer_full_bytes + outside_bytes + backward_bytes;
  }
};

struct ActivationQuery {
  const nlohmann::json& model_config;  // model.config
  int64_t seqlen = 0;                  // tokens per sample
  int64_t micro_batch_size = 1;        // samples per micro-batch
  at::ScalarType param_dtype = at::kFloat;  // the gathered params' dtype
  // (H, W) in pixels, as the image processor sizes them, of every image of one sample (a model
  // with a vision tower counts its activations from them; seqlen already holds their tokens).
  std::vector<std::pair<int64_t, int64_t>> images;
};

}  // namespace mmtrain
