// MagiHuman's base sampler (upstream inference/pipeline/video_generate.py at 209209b,
// `evaluate_with_latent`): noise for the audio and video latents, then per step one forward with
// the prompt and, with classifier-free guidance, one with the negative prompt, the two velocities
// mixed per modality, and a FlowUniPC step for each of video and audio. docs/sampling.md.
#pragma once
#include "core/batch.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>

namespace mmtrain::sample {

struct MagiHumanSampling {
  int64_t steps = 32;
  double shift = 5.0;
  double guidance_video = 5.0;           // the video text guidance while t > guidance_switch_timestep
  double guidance_video_low_noise = 2.0;  // upstream's video guidance at t <= 500
  int64_t guidance_switch_timestep = 500;
  double guidance_audio = 5.0;
};

// The latent sizes of a clip: `seconds` at 25 fps is seconds * 25 + 1 audio latent frames (upstream's
// num_frames), (frames - 1) / 4 + 1 video latent frames of (height / 16) x (width / 16).
struct MagiHumanLatentShape {
  int64_t latent_channels = 0;  // z: video_in_channels / 4
  int64_t frames = 0;           // T'
  int64_t height = 0, width = 0;  // the latent's, even
  int64_t audio_frames = 0;     // Na
  int64_t audio_channels = 0;   // Ca

  static MagiHumanLatentShape of_clip(double seconds, int64_t height_px, int64_t width_px, int64_t video_in_channels,
                                      int64_t audio_in_channels);
};

struct MagiHumanSample {
  at::Tensor video;  // [z, T', h, w] fp32, the normalized VAE latent
  at::Tensor audio;  // [Na, Ca] fp32
};

// A video latent [z, T, h, w] as tokens [T * h/2 * w/2, 4z] in upstream's input order (UnfoldNd 1x2x2:
// column c*4 + kh*2 + kw, tokens t-major then h then w): what the DiT reads and prepare writes.
at::Tensor video_tokens(const at::Tensor& latent);

// One packed sample as the DiT reads it, from noisy latents and a text embedding [Nt, Ct]:
// x [L, io_width] = [video tokens (1x2x2 patches, channel c*4 + kh*2 + kw) | audio rows | text rows],
// coords_mapping, modality_mapping, cu_seqlens, max_seqlen, and the zero target_velocity and false
// loss_mask a forward needs (the loss is not used).
Batch pack_magihuman_input(const at::Tensor& video, const at::Tensor& audio, const at::Tensor& text, int64_t io_width,
                           int64_t out_width);

// The DiT's prediction [L, out_width] -> the velocity of the video latent [z, T', h, w] (its tokens
// are in the output order (pT, pH, pW, C): upstream's depack_token_sequence) and of the audio [Na, Ca].
MagiHumanSample split_magihuman_output(const at::Tensor& prediction, const MagiHumanLatentShape& shape);

// forward: a packed batch -> the DiT's prediction [L, out_width] (the caller runs the model and its
// FSDP gathers). Noise: audio [1, Na, Ca] first, then video [1, z, T', h, w], both N(0, 1) from
// `generator`, as upstream draws them; without a negative embedding the sampler runs upstream's
// cfg_number 1 path (one forward a step, the DDIM-style update with fresh noise from `generator`).
MagiHumanSample sample_magihuman(const std::function<at::Tensor(const Batch&)>& forward, const at::Tensor& text,
                                 const std::optional<at::Tensor>& negative_text, const MagiHumanLatentShape& shape,
                                 const MagiHumanSampling& settings, at::Generator& generator, int64_t io_width,
                                 int64_t out_width);

}  // namespace mmtrain::sample
