#include "data/conversation/prompt_dataset.h"

#include "core/error.h"
#include "data/image/pixtral_image.h"

#include <algorithm>
#include <limits>

namespace mmtrain::conversation {

namespace {

// The keys a conversation record's messages and images are under; every other key is a field.
const std::vector<std::string> kConversationKeys = {"messages", "conversations", "images", "image"};

nlohmann::json fields_of(const nlohmann::json& record) {
  nlohmann::json out = nlohmann::json::object();
  if (!record.is_object()) return out;
  for (const auto& [key, value] : record.items())
    if (std::find(kConversationKeys.begin(), kConversationKeys.end(), key) == kConversationKeys.end()) out[key] = value;
  return out;
}

}  // namespace

PromptDataset::PromptDataset(const ConversationDataOptions& options) {
  if (options.packing)
    fail("data.dataset_param.basic_parameters.packing: dataset_type prompts generates from each prompt alone (set false)");
  auto o = options;
  o.generation = true;
  auto records = read_records(o.dataset_file);
  if (o.max_samples > 0 && static_cast<int64_t>(records.size()) > o.max_samples) records.resize(o.max_samples);
  prompts_ = std::make_unique<ConversationDataset>(o, records);
  // The records each kept prompt came from, in order (the reader keeps them ascending).
  for (size_t r = 0; r < records.size(); ++r)
    if (prompts_->sample_of_record(static_cast<int64_t>(r))) fields_.push_back(fields_of(records[r]));
  if (static_cast<int64_t>(fields_.size()) != prompts_->size())
    fail("dataset prompts ", o.dataset_file, ": ", fields_.size(), " records kept for ", prompts_->size(), " prompts");
  if (prompts_->size() == 0) fail("dataset prompts ", o.dataset_file, ": no usable prompt (", prompts_->summary(), ")");
  tokenizer_path_ = o.tokenizer_path;
  tokenizer_options_ = o.tokenizer;
}

Batch PromptDataset::get(int64_t index) const {
  Batch out = prompts_->get(index);
  out.erase("labels");
  out["sample_index"] = at::tensor({index}, at::kLong);
  return out;
}

std::string PromptDataset::summary() const { return "prompts: " + prompts_->summary(); }

namespace {

class PromptCollator : public Collator {
 public:
  Batch collate(const std::vector<Batch>& samples, std::vector<at::Generator>& generators) const override {
    std::vector<at::Tensor> ids, pixels, sizes;
    std::vector<int64_t> lengths, indices, seeds, image_counts;
    for (size_t b = 0; b < samples.size(); ++b) {
      const auto& s = samples[b];
      ids.push_back(batch_get(s, "input_ids"));
      lengths.push_back(ids.back().size(0));
      indices.push_back(batch_get(s, "sample_index").item<int64_t>());
      // A non-negative int64 from the sample's own stream: the same whichever rank collates it.
      seeds.push_back(at::randint(std::numeric_limits<int64_t>::max() / 2, {1}, generators[b]).item<int64_t>());
      const auto found = s.find("pixel_values");
      image_counts.push_back(found == s.end() ? 0 : found->second.size(0));
      if (found != s.end()) {
        for (int64_t i = 0; i < found->second.size(0); ++i) pixels.push_back(found->second.narrow(0, i, 1));
        sizes.push_back(batch_get(s, "image_sizes"));
      }
    }
    Batch out = {{"prompt_ids", at::cat(ids)},
                 {"prompt_lengths", at::tensor(lengths, at::kLong)},
                 {"sample_index", at::tensor(indices, at::kLong)},
                 {"rollout_seed", at::tensor(seeds, at::kLong)},
                 {"image_counts", at::tensor(image_counts, at::kLong)}};
    if (!pixels.empty()) {
      out["pixel_values"] = image::concat_padded_images(pixels);
      out["image_sizes"] = at::cat(sizes);
    }
    return out;
  }
};

const DatasetRegistration dataset(kPromptsDatasetType, [](const DataConfig& data, const ModelConfig& model) {
  return std::make_shared<PromptDataset>(ConversationDataOptions::from_config(data, model));
});
const CollatorRegistration collator("prompts", [](const DataConfig&, const ModelConfig&) {
  return std::make_shared<PromptCollator>();
});

}  // namespace

std::vector<CollatedPrompt> split_prompts(const Batch& micro_batch) {
  const auto lengths = batch_get(micro_batch, "prompt_lengths");
  const auto counts = batch_get(micro_batch, "image_counts");
  const auto& ids = batch_get(micro_batch, "prompt_ids");
  std::vector<CollatedPrompt> out;
  int64_t token = 0, image = 0;
  for (int64_t p = 0; p < lengths.size(0); ++p) {
    CollatedPrompt prompt;
    const int64_t length = lengths[p].item<int64_t>(), images = counts[p].item<int64_t>();
    prompt.batch["input_ids"] = ids.narrow(0, token, length).unsqueeze(0);
    if (images > 0) {
      const auto sizes = batch_get(micro_batch, "image_sizes").narrow(0, image, images);
      // Each prompt's images padded to its own largest, as `mmtrain sample` pads them.
      const int64_t h = sizes.select(1, 0).max().item<int64_t>(), w = sizes.select(1, 1).max().item<int64_t>();
      prompt.batch["pixel_values"] =
          batch_get(micro_batch, "pixel_values").narrow(0, image, images).narrow(2, 0, h).narrow(3, 0, w).contiguous();
      prompt.batch["image_sizes"] = sizes;
    }
    prompt.sample_index = batch_get(micro_batch, "sample_index")[p].item<int64_t>();
    prompt.rollout_seed = batch_get(micro_batch, "rollout_seed")[p].item<int64_t>();
    token += length;
    image += images;
    out.push_back(std::move(prompt));
  }
  return out;
}

}  // namespace mmtrain::conversation
