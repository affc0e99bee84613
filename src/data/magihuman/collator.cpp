// `magihuman` collator (MindSpeed-MM MagiHumanPrecomputedDataset._build_packed_sample +
// collate_fn): noise each sample with its own sigma, pack [video | audio | text] rows, and
// concatenate the samples along tokens. Also registers the dataset and collator names.
#include "data/magihuman/collator.h"

#include "core/error.h"
#include "core/param_map.h"
#include "models/magihuman/config.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <array>
#include <limits>

namespace mmtrain::magihuman {

at::Tensor video_channels_last_within_patch(const at::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.size(1) % 4 != 0)
    fail("video target reorder: expected tokens [n, 4C] (1x2x2 patches), found shape ", tokens.sizes());
  const int64_t n = tokens.size(0), c = tokens.size(1) / 4;
  return tokens.reshape({n, c, 1, 2, 2}).permute({0, 2, 3, 4, 1}).reshape({n, 4 * c});
}

at::Tensor get_coords(const std::array<int64_t, 3>& shape, const std::array<int64_t, 3>& ref,
                      const std::array<int64_t, 3>& offset) {
  const int64_t n = shape[0] * shape[1] * shape[2];
  auto out = at::empty({n, 9}, at::kFloat);
  for (int axis = 0; axis < 3; ++axis) {
    std::vector<int64_t> view = {1, 1, 1};
    view[axis] = shape[axis];
    // meshgrid(..., indexing="ij").reshape(-1): axis values broadcast over the other two.
    auto values = (at::arange(shape[axis], at::kLong) + offset[axis]).to(at::kFloat);
    out.select(1, axis).copy_(values.view(view).expand({shape[0], shape[1], shape[2]}).reshape({n}));
    out.select(1, 3 + axis).fill_(static_cast<double>(shape[axis]));
    out.select(1, 6 + axis).fill_(static_cast<double>(ref[axis]));
  }
  return out;
}

at::Tensor sample_coords(const std::array<int64_t, 3>& video_grid, int64_t audio_tokens, int64_t text_tokens) {
  // Audio ref_T = ((Na - 1) // 4 + 1) // t_patch_size (= 1), at least 1: the video latent frame
  // count of the same clip (Wan VAE temporal stride 4), so audio lands on the video time axis.
  const int64_t na = audio_tokens, nt = text_tokens;
  const int64_t audio_ref_t = na > 0 ? std::max<int64_t>((na - 1) / 4 + 1, 1) : 1;
  return at::cat({get_coords(video_grid, video_grid, {0, 0, 0}),
                  get_coords({na, 1, 1}, {audio_ref_t, 1, 1}, {0, 0, 0}),
                  get_coords({nt, 1, 1}, {1, 1, 1}, {-nt, 0, 0})});
}

Batch MagiHumanCollator::collate(const std::vector<Batch>& samples, std::vector<at::Generator>& generators) const {
  return collate_with(samples, generators, std::nullopt);
}

Batch MagiHumanCollator::collate_at_timestep(const std::vector<Batch>& samples, std::vector<at::Generator>& generators,
                                             double timestep) const {
  return collate_with(samples, generators, timestep);
}

// logit_normal: sigmoid(loc + scale x Phi^-1(q)), Phi^-1(q) = sqrt(2) erfinv(2q - 1); uniform: q.
std::optional<double> MagiHumanCollator::timestep_quantile(double q) const {
  if (!(q > 0.0 && q < 1.0)) fail("collator magihuman: a timestep quantile must be in (0, 1), found ", q);
  const auto& o = options_;
  if (o.sigma_sampling != SigmaSampling::kLogitNormal) return q;
  const double z = std::sqrt(2.0) * at::erfinv(at::scalar_tensor(2.0 * q - 1.0, at::kDouble)).item<double>();
  return 1.0 / (1.0 + std::exp(-(z * o.logit_normal_scale + o.logit_normal_loc)));
}

Batch MagiHumanCollator::collate_with(const std::vector<Batch>& samples, std::vector<at::Generator>& generators,
                                      std::optional<double> timestep) const {
  const auto& o = options_;
  if (samples.empty()) fail("collator magihuman: expected at least one sample, found none");
  if (generators.size() != samples.size())
    fail("collator magihuman: ", samples.size(), " samples need as many generators, found ", generators.size());
  struct Parts {
    at::Tensor video, audio, text;
    std::array<int64_t, 3> grid;
  };
  std::vector<Parts> parts;
  int64_t total = 0, max_len = 0;
  for (size_t b = 0; b < samples.size(); ++b) {
    Parts p{batch_get(samples[b], "video_latent"), batch_get(samples[b], "audio_latent"),
            batch_get(samples[b], "text_embed"), {}};
    const auto grid = batch_get(samples[b], "video_grid_thw").to(at::kLong).contiguous();
    auto check = [&](const at::Tensor& t, int64_t width, const char* name, const char* key) {
      if (t.dim() != 2 || t.size(1) != width || t.scalar_type() != at::kFloat)
        fail("collator magihuman: sample ", b, " '", name, "' must be fp32 [N, ", width, "] (data.dataset_param.", key,
             "), found ", t.scalar_type(), " ", t.sizes());
    };
    check(p.video, o.video_in_channels, "video_latent", "video_in_channels");
    check(p.audio, o.audio_in_channels, "audio_latent", "audio_in_channels");
    check(p.text, o.text_in_channels, "text_embed", "text_in_channels");
    if (grid.numel() != 3 || grid.prod().item<int64_t>() != p.video.size(0))
      fail("collator magihuman: sample ", b, " video_grid_thw ", grid, " does not match ", p.video.size(0),
           " video tokens");
    for (int i = 0; i < 3; ++i) p.grid[i] = grid[i].item<int64_t>();
    const int64_t len = p.video.size(0) + p.audio.size(0) + p.text.size(0);
    total += len;
    max_len = std::max(max_len, len);
    parts.push_back(std::move(p));
  }
  if (total > std::numeric_limits<int32_t>::max())
    fail("collator magihuman: ", total, " packed tokens do not fit cu_seqlens int32");

  auto x = at::zeros({total, o.io_width()}, at::kFloat);
  auto target = at::zeros({total, o.out_width()}, at::kFloat);
  auto coords = at::empty({total, 9}, at::kFloat);
  auto modality = at::empty({total}, at::kLong);
  auto loss_mask = at::zeros({total}, at::kBool);
  auto cu_seqlens = at::empty({static_cast<int64_t>(parts.size()) + 1}, at::kInt);
  auto* cu = cu_seqlens.data_ptr<int32_t>();
  cu[0] = 0;

  int64_t row = 0;
  for (size_t b = 0; b < parts.size(); ++b) {
    const auto& p = parts[b];
    const int64_t nv = p.video.size(0), na = p.audio.size(0), nt = p.text.size(0);
    // Fixed draw order (documented in collator.h): sigma, video noise, audio noise. A fixed
    // timestep (evaluation) draws no sigma: the noise is then the generator's first draws.
    auto& generator = generators[b];
    at::Tensor sigma;
    if (timestep) {
      sigma = at::full({1}, *timestep, at::kFloat);
    } else {
      const auto z = o.sigma_sampling == SigmaSampling::kLogitNormal ? at::randn({1}, generator, at::kFloat)
                                                                     : at::rand({1}, generator, at::kFloat);
      sigma = o.sigma_sampling == SigmaSampling::kLogitNormal ? at::sigmoid(z * o.logit_normal_scale + o.logit_normal_loc)
                                                              : z;
    }
    const auto eps_v = at::randn({nv, o.video_in_channels}, generator, at::kFloat);
    const auto eps_a = at::randn({na, o.audio_in_channels}, generator, at::kFloat);
    const auto keep = 1 - sigma;  // [1], broadcasts over rows and channels

    x.narrow(0, row, nv).narrow(1, 0, o.video_in_channels).copy_(keep * p.video + sigma * eps_v);
    x.narrow(0, row + nv, na).narrow(1, 0, o.audio_in_channels).copy_(keep * p.audio + sigma * eps_a);
    x.narrow(0, row + nv + na, nt).narrow(1, 0, o.text_in_channels).copy_(p.text);
    // The model's video head emits (pT,pH,pW,C) while x holds (C,pT,pH,pW): reorder the target only.
    target.narrow(0, row, nv).narrow(1, 0, o.video_in_channels).copy_(video_channels_last_within_patch(eps_v - p.video));
    target.narrow(0, row + nv, na).narrow(1, 0, o.audio_in_channels).copy_(eps_a - p.audio);
    coords.narrow(0, row, nv + na + nt).copy_(sample_coords(p.grid, na, nt));
    modality.narrow(0, row, nv).fill_(static_cast<int64_t>(kVideo));
    modality.narrow(0, row + nv, na).fill_(static_cast<int64_t>(kAudio));
    modality.narrow(0, row + nv + na, nt).fill_(static_cast<int64_t>(kText));
    loss_mask.narrow(0, row, nv + na).fill_(true);
    row += nv + na + nt;
    cu[b + 1] = static_cast<int32_t>(row);
  }
  return {{"x", x},
          {"coords_mapping", coords},
          {"modality_mapping", modality},
          {"target_velocity", target},
          {"loss_mask", loss_mask},
          {"cu_seqlens", cu_seqlens},
          {"max_seqlen", at::scalar_tensor(max_len, at::kInt)}};
}

namespace {

const DatasetRegistration dataset("magihuman_precomputed", [](const DataConfig& data, const ModelConfig& model) {
  return std::make_shared<PrecomputedDataset>(PrecomputedDataOptions::from_json(with_model_channels(data, model)));
});
const CollatorRegistration collator("magihuman", [](const DataConfig& data, const ModelConfig& model) {
  const ParamMap p(data.loader.collate_param, "data.dataloader_param.collate_param", "collator magihuman");
  p.check_known_keys({"model_name", "ignore_pad_token_for_loss"});
  // The seed's YAML carries MindSpeed's LM key; a MagiHuman batch has no pad tokens to ignore.
  if (p.get_bool("ignore_pad_token_for_loss", false))
    fail(p.where("ignore_pad_token_for_loss"), ": MagiHuman batches have no pad tokens; only false is meaningful");
  return std::make_shared<MagiHumanCollator>(PrecomputedDataOptions::from_json_collate(with_model_channels(data, model)));
});

}  // namespace

}  // namespace mmtrain::magihuman
