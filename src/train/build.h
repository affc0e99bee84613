// Turning a Config into the pieces of a run: the model (from the registry, shapes only), the
// FSDP options, and the initial weights. Shared by the trainer and the tools (debug, convert).
#pragma once
#include "core/config.h"
#include "fsdp/fully_shard.h"
#include "models/model.h"
#include "optim/adamw.h"

#include <memory>

namespace mmtrain {

std::shared_ptr<Model> build_model(const Config& config);
FsdpOptions fsdp_options(const Config& config);
// AdamW over every unit's fp32 flat shard and grad, with frozen parameters (requires_grad
// false) masked out of the update.
std::unique_ptr<AdamW> make_fsdp_adamw(Fsdp& fsdp, const AdamWOptions& options);
// Weights from model.checkpoint_path / model_name_or_path (HF layout), else a seeded random
// init. Returns how many tensors had their layout converted (0 for a random init).
int64_t load_initial_weights(const Config& config, Model& model, Fsdp& fsdp);

}  // namespace mmtrain
