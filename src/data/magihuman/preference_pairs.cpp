#include "data/magihuman/preference_pairs.h"

#include "core/error.h"
#include "core/json_read.h"
#include "core/param_map.h"
#include "core/regular_file.h"
#include "io/atomic_file.h"
#include "models/model.h"

#include <map>
#include <sstream>

namespace mmtrain::magihuman {

namespace {

const char* const kSides[] = {"chosen", "rejected"};

// "video grid (T, H', W') and N audio rows" of a clip (its Batch from PrecomputedDataset::get).
std::string clip_shape(const Batch& clip) {
  const auto grid = clip.at("video_grid_thw");
  std::ostringstream text;
  text << "video grid (" << grid[0].item<int64_t>() << ", " << grid[1].item<int64_t>() << ", "
       << grid[2].item<int64_t>() << ") and " << clip.at("audio_latent").size(0) << " audio rows";
  return text.str();
}

bool same_noise_shape(const Batch& a, const Batch& b) {
  return at::equal(a.at("video_grid_thw"), b.at("video_grid_thw")) &&
         a.at("audio_latent").size(0) == b.at("audio_latent").size(0);
}

}  // namespace

PreferencePairsDataset::PreferencePairsDataset(std::shared_ptr<PrecomputedDataset> clips, const std::string& manifest,
                                               int64_t max_pairs)
    : clips_(std::move(clips)), manifest_(manifest) {
  const std::string label = "data.dataset_param.pairs '" + manifest + "'";
  require_regular_file(manifest, label, "a JSONL file of {\"chosen\": STEM, \"rejected\": STEM} lines");
  std::map<std::string, int64_t> index_of_stem;
  for (int64_t i = 0; i < clips_->size(); ++i) index_of_stem[clips_->stem(i)] = i;
  std::istringstream lines(file_read_text(manifest));
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = label + " line " + std::to_string(number);
    const auto record = json_parse_checked(line, where);
    if (!record.is_object()) fail(where, ": expected {\"chosen\": STEM, \"rejected\": STEM}, found ", record.dump());
    for (const auto& [key, value] : record.items())
      if (key != "chosen" && key != "rejected")
        fail(where, ": unknown key '", key, "' (a pair has only \"chosen\" and \"rejected\")");
    Pair pair{-1, -1, number};
    for (const char* side : kSides) {
      if (!record.contains(side) || !record[side].is_string())
        fail(where, ": \"", side, "\" must be a sample's stem (a string), found ",
             record.contains(side) ? record[side].dump() : std::string("nothing"));
      const auto stem = record[side].get<std::string>();
      const auto found = index_of_stem.find(stem);
      if (found == index_of_stem.end())
        fail(where, ": the ", side, " stem '", stem, "' is no sample of ", clips_->options().data_root,
             " (no latents/", stem, ".pt or .safetensors)");
      (std::string(side) == "chosen" ? pair.chosen : pair.rejected) = found->second;
    }
    if (pair.chosen == pair.rejected)
      fail(where, ": chosen and rejected are the same clip '", clips_->stem(pair.chosen),
           "': a pair compares two clips");
    pairs_.push_back(pair);
    if (max_pairs > 0 && static_cast<int64_t>(pairs_.size()) == max_pairs) break;
  }
  if (pairs_.empty()) fail(label, ": no pairs (an empty manifest)");
}

Batch PreferencePairsDataset::get(int64_t index) const {
  if (index < 0 || index >= size()) fail("magihuman_preference: pair index ", index, " outside 0..", size() - 1);
  const auto& pair = pairs_[static_cast<size_t>(index)];
  const Batch chosen = clips_->get(pair.chosen), rejected = clips_->get(pair.rejected);
  if (!same_noise_shape(chosen, rejected))
    fail(describe(index), ": the two clips of a pair share one noise, so they need one shape; chosen has ",
         clip_shape(chosen), ", rejected has ", clip_shape(rejected));
  Batch out;
  for (const auto& [key, value] : chosen) out["chosen/" + key] = value;
  for (const auto& [key, value] : rejected) out["rejected/" + key] = value;
  return out;
}

std::string PreferencePairsDataset::describe(int64_t index) const {
  if (index < 0 || index >= size()) return "pair " + std::to_string(index);
  const auto& pair = pairs_[static_cast<size_t>(index)];
  return "pair " + std::to_string(index) + " (chosen " + clips_->stem(pair.chosen) + ", rejected " +
         clips_->stem(pair.rejected) + ") of " + manifest_ + " line " + std::to_string(pair.line);
}

std::optional<int64_t> PreferencePairsDataset::sample_tokens(int64_t index) const {
  if (index < 0 || index >= size()) return std::nullopt;
  const auto& pair = pairs_[static_cast<size_t>(index)];
  const auto chosen = clips_->sample_tokens(pair.chosen), rejected = clips_->sample_tokens(pair.rejected);
  if (!chosen || !rejected) return std::nullopt;
  return *chosen + *rejected;
}

Batch PreferencePairsCollator::collate(const std::vector<Batch>& pairs, std::vector<at::Generator>& generators) const {
  if (generators.size() != pairs.size())
    fail("collator magihuman_preference: ", pairs.size(), " pairs need as many generators, found ", generators.size());
  const size_t count = pairs.size();
  std::vector<Batch> clips(2 * count);
  std::vector<at::Generator> clip_generators(2 * count);
  for (size_t b = 0; b < count; ++b) {
    for (const auto& [key, value] : pairs[b]) {
      const auto slash = key.find('/');
      const auto side = key.substr(0, slash);
      if (slash == std::string::npos || (side != "chosen" && side != "rejected"))
        fail("collator magihuman_preference: a sample with key '", key, "' is no preference pair (use dataset ",
             "magihuman_preference)");
      clips[side == "chosen" ? b : count + b][key.substr(slash + 1)] = value;
    }
    if (!same_noise_shape(clips[b], clips[count + b]))
      fail("collator magihuman_preference: pair ", b, " of the micro-batch has clips of two shapes (",
           clip_shape(clips[b]), "; ", clip_shape(clips[count + b]), ")");
    // The rejected clip draws from a copy of the chosen clip's stream, taken before either draws.
    clip_generators[count + b] = generators[b].clone();
    clip_generators[b] = generators[b];
  }
  Batch batch = clips_.collate(clips, clip_generators);
  batch[kPreferencePairsKey] = at::scalar_tensor(static_cast<int64_t>(count), at::kLong);
  return batch;
}

namespace {

// The clips' dataset_param (precomputed_dataset.h): without `pairs`, and max_samples counts pairs.
nlohmann::json clip_options(const DataConfig& data, const ModelConfig& model) {
  auto p = with_model_channels(data, model);
  p.erase("pairs");
  p.erase("max_samples");
  return p;
}

const DatasetRegistration dataset("magihuman_preference", [](const DataConfig& data, const ModelConfig& model) {
  const ParamMap p(data.dataset_param, "data.dataset_param", "dataset magihuman_preference");
  if (!p.has("pairs"))
    fail(p.where("pairs"), ": dataset magihuman_preference needs the pairs manifest (JSONL of {\"chosen\": STEM, ",
         "\"rejected\": STEM}; docs/preference.md)");
  const int64_t max_pairs = p.get_int("max_samples", 0);
  if (max_pairs < 0) fail(p.where("max_samples"), ": expected >= 0 pairs (0: all), found ", max_pairs);
  auto clips = std::make_shared<PrecomputedDataset>(PrecomputedDataOptions::from_json(clip_options(data, model)));
  return std::make_shared<PreferencePairsDataset>(std::move(clips), p.get_string("pairs", ""), max_pairs);
});

const CollatorRegistration collator("magihuman_preference", [](const DataConfig& data, const ModelConfig& model) {
  const ParamMap p(data.loader.collate_param, "data.dataloader_param.collate_param", "collator magihuman_preference");
  p.check_known_keys({"model_name"});
  return std::make_shared<PreferencePairsCollator>(PrecomputedDataOptions::from_json_collate(clip_options(data, model)));
});

}  // namespace

}  // namespace mmtrain::magihuman
