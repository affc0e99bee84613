// The MagiHuman DiT as a trainable model (model_id "magihuman"): f(x [L, io], coords [L, 9],
// modality [L]) -> prediction [L, out] with the flow-matching loss, for packed micro-batches
// (cu_seqlens). Internal names carry the seeds' "dit." prefix (fsdp patterns like
// dit.block.layers.{*}); the HF layout has none.
#pragma once
#include "models/magihuman/config.h"
#include "models/model.h"

namespace mmtrain::magihuman {

std::shared_ptr<Model> make_magihuman(const nlohmann::json& model_config);

}  // namespace mmtrain::magihuman

namespace mmtrain {
void register_magihuman_model();
}
