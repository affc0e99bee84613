// dataset_type "preference": pairs of answers to one prompt, the better one first, for preference
// objectives (training.objective dpo, train/objective.h). TRL's preference format, conversational,
// with images, in a JSON list or a JSONL file (basic_parameters.dataset, as "huggingface"):
//   {"images": ["a.png"], "prompt": [messages], "chosen": [messages], "rejected": [messages]}
// or, without "prompt" (TRL's implicit prompt), "chosen" and "rejected" as whole conversations whose
// common first messages are the prompt. A message is {"role": "system"|"user"|"assistant",
// "content": "text"} or with content a list of parts, {"type": "text", "text": "..."} and
// {"type": "image"} (each image part, or "<image>" in a text, is the next image of the record).
// The answer (what follows the prompt) must be one assistant message.
//
// Both sequences of a pair are encoded as the conversation data's own (chat template, image
// pipeline: data/conversation/conversation_dataset.h) with only the answer supervised and nothing
// truncated. Dropped, counted by reason in summary(): a malformed record, an answer that is not one
// assistant message, an empty answer, identical answers, and a pair with a sequence the
// conversation data drops (over cutoff_len, images missing or unreadable, ...).
//
// One item: chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels int64 [S_c], [S_r];
// pixel_values and image_sizes of the prompt's images once (both sequences hold the same images).
#pragma once
#include "data/conversation/conversation_dataset.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain::conversation {

class PreferenceDataset : public Dataset {
 public:
  explicit PreferenceDataset(ConversationDataOptions options);

  int64_t size() const override { return static_cast<int64_t>(pairs_.size()); }
  Batch get(int64_t index) const override;
  std::string describe(int64_t index) const override;
  std::string summary() const override;
  std::optional<int64_t> sample_tokens(int64_t index) const override;

 private:
  struct Pair {
    int64_t chosen = 0, rejected = 0;  // samples of sequences_
    std::string label;                 // "record N (id ...)"
  };

  ConversationDataOptions options_;
  std::unique_ptr<ConversationDataset> sequences_;  // record 2k: pair k's chosen, 2k + 1: its rejected
  std::vector<Pair> pairs_;
  int64_t records_ = 0;
  std::map<std::string, int64_t> dropped_;
  std::map<std::string, std::string> first_example_;
};

}  // namespace mmtrain::conversation
