// The `magihuman` collator: flow-matching noising and packing of precomputed samples into the
// MindSpeed-MM batch (x, coords_mapping, modality_mapping, target_velocity, loss_mask,
// cu_seqlens, max_seqlen). All randomness comes from the generators collate() is given (one per sample), drawn in
// a fixed order, so a (seed, step, micro-batch, rank) fixes the batch. docs/magihuman_data.md.
#pragma once
#include "data/magihuman/precomputed_dataset.h"

#include <ATen/ATen.h>

#include <array>

namespace mmtrain::magihuman {

// Video target channel order: tokens [n, 4C] in the input order (C, pT, pH, pW) (upstream
// img2tokens) -> the output order (pT, pH, pW, C) (upstream depack_token_sequence), i.e.
// tok.reshape(n, C, 1, 2, 2).permute(0, 2, 3, 4, 1).reshape(n, 4C). Out col (kh*2+kw)*C + c
// takes in col c*4 + kh*2 + kw.
at::Tensor video_channels_last_within_patch(const at::Tensor& tokens);

// upstream get_coords(shape, ref, offset): [T*H*W, 9] fp32 rows (t+off_t, h+off_h, w+off_w,
// T, H, W, ref_T, ref_H, ref_W), t-major then h then w. Raw grid indices: RoPE centres h/w later.
at::Tensor get_coords(const std::array<int64_t, 3>& shape, const std::array<int64_t, 3>& ref,
                      const std::array<int64_t, 3>& offset);

// One sample's coords_mapping (v2): [video (T,H,W); audio (Na,1,1) ref (max(((Na-1)/4+1), 1),1,1);
// text (Nt,1,1) ref (1,1,1) t offset -Nt], [Nv + Na + Nt, 9] fp32.
at::Tensor sample_coords(const std::array<int64_t, 3>& video_grid, int64_t audio_tokens, int64_t text_tokens);

// Per sample b, in this order from its generator generators[b]: sigma_b (logit_normal: one N(0,1) draw z,
// sigma = sigmoid(z * scale + loc); uniform: one U[0,1) draw), then eps_v [Nv, Cv] ~ N(0,1),
// then eps_a [Na, Ca] ~ N(0,1). x_t = (1 - sigma) x0 + sigma eps; target = eps - x0, the video
// target reordered (video_channels_last_within_patch). Output, L = sum of Nv + Na + Nt:
//   x [L, io_width] fp32        rows [video x_t | audio x_t | text embedding], zero-padded right
//   coords_mapping [L, 9] fp32  sample_coords per sample
//   modality_mapping [L] int64  0 video, 1 audio, 2 text
//   target_velocity [L, out_width] fp32   text rows and audio cols >= Ca are 0
//   loss_mask [L] bool          true on video and audio rows
//   cu_seqlens [B+1] int32, max_seqlen 0-dim int32
class MagiHumanCollator : public Collator {
 public:
  explicit MagiHumanCollator(PrecomputedDataOptions options) : options_(std::move(options)) {}
  Batch collate(const std::vector<Batch>& samples, std::vector<at::Generator>& generators) const override;
  // The training distribution's quantile q (sigma_sampling with its loc and scale: the shift).
  std::optional<double> timestep_quantile(double q) const override;
  // Evaluation: every sample at sigma = timestep; no sigma drawn, so eps_v, eps_a are the
  // generator's first draws.
  Batch collate_at_timestep(const std::vector<Batch>& samples, std::vector<at::Generator>& generators,
                            double timestep) const override;

 private:
  Batch collate_with(const std::vector<Batch>& samples, std::vector<at::Generator>& generators,
                     std::optional<double> timestep) const;
  PrecomputedDataOptions options_;
};

}  // namespace mmtrain::magihuman
