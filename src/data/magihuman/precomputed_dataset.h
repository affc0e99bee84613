// MagiHuman precomputed data: the `magihuman_precomputed` dataset reads one sample per stem from
// a `.precomputed` directory (latents/, audio_latents/, conditions/; `.pt` files from Python
// torch.save or `.safetensors`), lazily in get(), and checks every shape against the channel
// widths. Its options (PrecomputedDataOptions) are shared with the `magihuman` collator, which
// noises and packs the samples (data/magihuman/collator.h). Reference: docs/magihuman_data.md.
#pragma once
#include "data/dataset.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain::magihuman {

enum class SigmaSampling { kLogitNormal, kUniform };

// data.dataset_param of a MagiHuman run. The channel widths come from model.config when
// dataset_param does not give them (the registration fills them in); the files must agree. The
// directory may also be given MindSpeed-style as basic_parameters.dataset_dir (with
// basic_parameters.max_samples).
struct PrecomputedDataOptions {
  std::string data_root;                 // the .precomputed directory
  int64_t max_samples = 0;               // 0 = all samples
  int64_t video_in_channels = 192;       // Cv = latent channels x 4 (1x2x2 patch)
  int64_t audio_in_channels = 64;        // Ca
  int64_t text_in_channels = 3584;       // Ct
  SigmaSampling sigma_sampling = SigmaSampling::kLogitNormal;
  double logit_normal_loc = 0.0;
  double logit_normal_scale = 1.0;

  // Unknown keys, wrong types and impossible values are errors naming data.dataset_param.<key>.
  static PrecomputedDataOptions from_json(const nlohmann::json& dataset_param);
  // Only the collator's view: data_root is not required.
  static PrecomputedDataOptions from_json_collate(const nlohmann::json& dataset_param);

  int64_t io_width() const;   // x columns: max(Cv, Ca, Ct)
  int64_t out_width() const;  // target columns: max(Cv, Ca)
};

// data.dataset_param with the channel widths the model is configured for filled in where the data
// section does not give its own (which must then agree with the files).
nlohmann::json with_model_channels(const DataConfig& data, const ModelConfig& model);

// One sample as the dataset returns it (Batch keys):
//   video_latent   [Nv, Cv] fp32, channel order (C, pT, pH, pW) as upstream img2tokens emits
//   video_grid_thw [3] int64 (T, H', W'), T * H' * W' = Nv
//   audio_latent   [Na, Ca] fp32
//   text_embed     [Nt, Ct] fp32
class PrecomputedDataset : public Dataset {
 public:
  explicit PrecomputedDataset(PrecomputedDataOptions options);

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  Batch get(int64_t index) const override;
  std::string describe(int64_t index) const override;  // its latents file
  // Video + audio + text rows: the packed sequence the sample becomes (from the headers when the
  // sample's files are safetensors).
  std::optional<int64_t> sample_tokens(int64_t index) const override;

  const std::string& stem(int64_t index) const;
  const PrecomputedDataOptions& options() const { return options_; }

 private:
  struct SampleFiles {
    std::string stem;
    std::string latents, audio_latents, conditions;  // full paths
  };
  void check_prepared_widths(const std::filesystem::path& root) const;

  PrecomputedDataOptions options_;
  std::vector<SampleFiles> samples_;  // sorted by stem
};

// Reads one tensor file into name -> value: a `.pt` holding a dict (torch.save zip format; a
// list/tuple value becomes an int64 tensor) or a `.safetensors` file. Errors name the path.
std::map<std::string, at::Tensor> read_sample_file(const std::string& path);

// Writes a dict of tensors as torch.save does (zip format, loadable by Python's
// torch.load(weights_only=True)). Atomic (tmp + rename).
void write_pt_file(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors);

}  // namespace mmtrain::magihuman
