// collator "preference": micro-batches of preference pairs (data/conversation/preference_dataset.h)
// for a preference objective (train/objective.h). P pairs become 2P rows, TRL's order:
// [chosen_0 .. chosen_{P-1}, rejected_0 .. rejected_{P-1}], padded as the pixtral collator pads
// (data/conversation/vlm_collator.h); each row carries its pair's images (pixel_values in row
// order), and batch key "preference_pairs" holds P. A pair is never split over micro-batches.
#pragma once
#include "data/dataset.h"

namespace mmtrain::conversation {

class PreferenceCollator : public Collator {
 public:
  explicit PreferenceCollator(int64_t pad_token_id) : pad_token_id_(pad_token_id) {}
  Batch collate(const std::vector<Batch>& pairs, std::vector<at::Generator>& generators) const override;

 private:
  int64_t pad_token_id_;
};

}  // namespace mmtrain::conversation
