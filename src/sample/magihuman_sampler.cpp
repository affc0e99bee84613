#include "sample/magihuman_sampler.h"

#include "core/error.h"
#include "data/magihuman/collator.h"
#include "models/magihuman/config.h"
#include "sample/flow_unipc.h"

#include <cmath>

namespace mmtrain::sample {

namespace {

constexpr int64_t kFps = 25;
constexpr int64_t kTemporalStride = 4, kSpatialStride = 16, kPatch = 2;

}  // namespace

at::Tensor video_tokens(const at::Tensor& latent) {
  const int64_t z = latent.size(0), t = latent.size(1), h = latent.size(2) / kPatch, w = latent.size(3) / kPatch;
  return latent.reshape({z, t, h, kPatch, w, kPatch}).permute({1, 2, 4, 0, 3, 5}).reshape({t * h * w, z * 4});
}

MagiHumanLatentShape MagiHumanLatentShape::of_clip(double seconds, int64_t height_px, int64_t width_px,
                                                   int64_t video_in_channels, int64_t audio_in_channels) {
  if (!(seconds > 0)) fail("sampling: seconds must be > 0, found ", seconds);
  const double rounded = std::round(seconds * kFps);
  if (std::abs(seconds * kFps - rounded) > 1e-6)
    fail("sampling: seconds ", seconds, " is not a whole number of frames at ", kFps, " fps");
  const int64_t pixels = kSpatialStride * kPatch;
  if (height_px <= 0 || width_px <= 0 || height_px % pixels || width_px % pixels)
    fail("sampling: resolution ", height_px, "x", width_px, ": both sides must be positive multiples of ", pixels);
  MagiHumanLatentShape s;
  s.latent_channels = video_in_channels / 4;
  s.audio_frames = static_cast<int64_t>(rounded) + 1;  // upstream: num_frames = seconds * fps + 1
  s.frames = (s.audio_frames - 1) / kTemporalStride + 1;
  s.height = height_px / kSpatialStride;
  s.width = width_px / kSpatialStride;
  s.audio_channels = audio_in_channels;
  return s;
}

Batch pack_magihuman_input(const at::Tensor& video, const at::Tensor& audio, const at::Tensor& text, int64_t io_width,
                           int64_t out_width) {
  using namespace magihuman;
  const at::Tensor tokens = video_tokens(video);
  const int64_t nv = tokens.size(0), na = audio.size(0), nt = text.size(0), total = nv + na + nt;
  auto pad = [io_width](const at::Tensor& rows) {
    return at::constant_pad_nd(rows.to(at::kFloat), {0, io_width - rows.size(1)});
  };
  Batch batch;
  batch["x"] = at::cat({pad(tokens), pad(audio), pad(text)});
  batch["coords_mapping"] = sample_coords({video.size(1), video.size(2) / kPatch, video.size(3) / kPatch}, na, nt);
  batch["modality_mapping"] = at::cat({at::full({nv}, kVideo, at::kLong), at::full({na}, kAudio, at::kLong),
                                       at::full({nt}, kText, at::kLong)});
  batch["cu_seqlens"] = at::tensor(std::vector<int32_t>{0, static_cast<int32_t>(total)}, at::kInt);
  batch["max_seqlen"] = at::scalar_tensor(static_cast<int32_t>(total), at::kInt);
  batch["target_velocity"] = at::zeros({total, out_width}, at::kFloat);
  batch["loss_mask"] = at::zeros({total}, at::kBool);
  return batch;
}

MagiHumanSample split_magihuman_output(const at::Tensor& prediction, const MagiHumanLatentShape& s) {
  const int64_t h = s.height / kPatch, w = s.width / kPatch, nv = s.frames * h * w, z = s.latent_channels;
  const at::Tensor video = prediction.slice(0, 0, nv).slice(1, 0, 4 * z);
  // "(T H W) (pT pH pW C) -> C (T pT) (H pH) (W pW)" with pT = 1
  MagiHumanSample out;
  out.video = video.reshape({s.frames, h, w, kPatch, kPatch, z}).permute({5, 0, 1, 3, 2, 4}).reshape(
      {z, s.frames, s.height, s.width});
  out.audio = prediction.slice(0, nv, nv + s.audio_frames).slice(1, 0, s.audio_channels);
  return out;
}

MagiHumanSample sample_magihuman(const std::function<at::Tensor(const Batch&)>& forward, const at::Tensor& text,
                                 const std::optional<at::Tensor>& negative_text, const MagiHumanLatentShape& shape,
                                 const MagiHumanSampling& settings, at::Generator& generator, int64_t io_width,
                                 int64_t out_width) {
  for (const double g : {settings.guidance_video, settings.guidance_audio, settings.guidance_video_low_noise})
    if (!std::isfinite(g)) fail("sampling: a guidance scale is not finite (", g, ")");
  const auto options = at::TensorOptions().dtype(at::kFloat);
  at::Tensor audio = at::randn({shape.audio_frames, shape.audio_channels}, generator, options);
  at::Tensor video = at::randn({shape.latent_channels, shape.frames, shape.height, shape.width}, generator, options);
  FlowUniPCScheduler video_scheduler(settings.steps, settings.shift), audio_scheduler(settings.steps, settings.shift);
  auto velocities = [&](const at::Tensor& embedding) {
    return split_magihuman_output(forward(pack_magihuman_input(video, audio, embedding, io_width, out_width)), shape);
  };
  for (int64_t i = 0; i < video_scheduler.steps(); ++i) {
    const int64_t t = video_scheduler.timesteps()[i];
    MagiHumanSample v = velocities(text);
    if (!negative_text) {  // cfg_number 1
      video = video_scheduler.step_ddim(v.video, i, video, generator);
      audio = audio_scheduler.step_ddim(v.audio, i, audio, generator);
      continue;
    }
    const MagiHumanSample u = velocities(*negative_text);
    const double video_scale =
        t > settings.guidance_switch_timestep ? settings.guidance_video : settings.guidance_video_low_noise;
    const at::Tensor video_velocity = u.video + video_scale * (v.video - u.video);
    const at::Tensor audio_velocity = u.audio + settings.guidance_audio * (v.audio - u.audio);
    video = video_scheduler.step(video_velocity, video);
    audio = audio_scheduler.step(audio_velocity, audio);
  }
  return {video, audio};
}

}  // namespace mmtrain::sample
