// Mistral3 (Magistral-Small-2509) as a trainable model (model_id "mistral3"): Pixtral vision
// encoder -> projector (RMSNorm, PatchMerger, linear-GELU-linear) -> features scattered into the
// text embeddings at [IMG] tokens -> Mistral LM -> shifted cross-entropy (docs/mistral3.md).
//
// Batch keys:
//   input_ids     int64 [B, S]
//   labels        int64 [B, S]; -100 = not supervised. loss = mean over supervised tokens of
//                 CE(logits[:, t], labels[:, t + 1]) (HF ForCausalLMLoss without num_items_in_batch)
//   position_ids  int64 [B, S], optional (default arange(S) per row, or per packed sample);
//                 RoPE positions only: attention follows cu_seqlens
//   cu_seqlens    int [k + 1], optional: packing. B must be 1; samples [cu[i], cu[i+1]) attend
//                 causally within themselves only. The loss shifts over the whole row, so the
//                 first label of every sample must be -100 (it is prompt) or it is predicted
//                 from the previous sample's last token
//   attention_mask  int [B, S], optional: 1 on tokens, 0 on right padding (pixtral collator).
//                 Causal attention already keeps padding out of every real token's context, so
//                 the forward ignores it; FLOPs count only masked-in tokens
//   pixel_values  float [N_img, C, H_max, W_max], optional: images zero-padded bottom/right, in
//                 batch-sample order then in-sample order (the order of the [IMG] tokens)
//   image_sizes   int64 [N_img, 2] (H_i, W_i), required with pixel_values: the sizes before padding
// The number of [IMG] tokens (config image_token_index) must equal sum_i (H_i/p/m)*(W_i/p/m)
// (p = patch_size, m = spatial_merge_size, floor); a mismatch is an error.
//
// Outputs (ModelOutput::tensors): "vision_features" [P_tot, Dv] (the last Pixtral layer, all
// images as one sequence), "projected_features" [N_[IMG], H], "logits" [B, S, V].
//
// Parameter names are the HF names of transformers >= 4.52 (model.language_model.*,
// model.vision_tower.*, model.multi_modal_projector.*, lm_head.weight); the legacy names load too
// (hf_adapter.h). Every tensor's checkpoint dtype is bf16, as in Magistral's public checkpoint.
// Blocks for fsdp/recompute plans: model.language_model.layers.{*} and
// model.vision_tower.transformer.layers.{*}.
// With freeze_vision (default), vision tower and projector params have requires_grad = false
// and run under no-grad: no grads, no reduce-scatter for vision units, no optimizer updates.
#pragma once
#include "models/mistral3/config.h"
#include "models/model.h"

#include <memory>

namespace mmtrain::mistral3 {

std::shared_ptr<Model> make_mistral3(const Mistral3Config& config);

}  // namespace mmtrain::mistral3
