// The MagiHuman DiT as a trainable model (model_id "magihuman"): f(x [L, io], coords [L, 9],
// modality [L]) -> prediction [L, out] with the flow-matching loss, for packed micro-batches
// (cu_seqlens). Internal names carry the seeds' "dit." prefix (fsdp patterns like
// dit.block.layers.{*}); the HF layout has none (hf_adapter.h). The Module tree is the table of
// the checkpoint's tensors: names, shapes and on-disk dtypes (bf16 linears and biases, fp32 norms
// and rope bands), 331 for the full model.
#pragma once
#include "models/magihuman/config.h"
#include "models/model.h"

#include <memory>

namespace mmtrain::magihuman {

std::shared_ptr<Model> make_magihuman(const MagiHumanConfig& config);

}  // namespace mmtrain::magihuman
