// GRPO's prompts (train/grpo_objective.h): dataset_type "prompts", records in the conversation data's own format (LLaVA /
// sharegpt or LLaMA-Factory messages, images) read as `mmtrain sample` reads prompts (a final
// assistant message is dropped; a prompt over cutoff_len is dropped and counted), each record's
// other fields ("answer", "solution", a schema: anything but the messages and images) kept for the
// rewards. Collator "prompts" keeps a micro-batch's prompts apart for generation:
//   prompt_ids     int64 [Σ lengths]  the prompts one after another
//   prompt_lengths int64 [P]
//   sample_index   int64 [P]           each prompt's index in the data set (for its fields)
//   rollout_seed   int64 [P]           drawn from the sample's own generator (seed, stream position):
//                                      completion g of the prompt samples with rollout_seed + g
//   pixel_values [I, 3, H, W], image_sizes [I, 2], image_counts int64 [P]   when there are images
// docs/grpo.md.
#pragma once
#include "data/conversation/conversation_dataset.h"
#include "data/dataset.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace mmtrain::conversation {

inline constexpr const char* kPromptsDatasetType = "prompts";

class PromptDataset : public Dataset {
 public:
  explicit PromptDataset(const ConversationDataOptions& options);

  int64_t size() const override { return prompts_->size(); }
  Batch get(int64_t index) const override;  // input_ids [S], images, and sample_index [1]
  std::string summary() const override;
  std::optional<int64_t> sample_tokens(int64_t index) const override { return prompts_->sample_tokens(index); }

  // The prompt's record fields other than its messages and images (an object).
  const nlohmann::json& fields(int64_t index) const { return fields_.at(static_cast<size_t>(index)); }
  const std::string& last_user_message(int64_t index) const { return prompts_->last_user_message(index); }
  const std::string& tokenizer_path() const { return tokenizer_path_; }
  const tokenizer::TextTokenizerOptions& tokenizer_options() const { return tokenizer_options_; }

 private:
  std::unique_ptr<ConversationDataset> prompts_;
  std::vector<nlohmann::json> fields_;  // per prompt
  std::string tokenizer_path_;
  tokenizer::TextTokenizerOptions tokenizer_options_;
};

// The P prompts of a collated micro-batch, each as `mmtrain sample` feeds one to the generator:
// input_ids [1, S], pixel_values and image_sizes of its own images.
struct CollatedPrompt {
  Batch batch;
  int64_t sample_index = 0;
  int64_t rollout_seed = 0;
};
std::vector<CollatedPrompt> split_prompts(const Batch& micro_batch);

}  // namespace mmtrain::conversation
