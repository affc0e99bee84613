// collator "preference": micro-batches of preference pairs (data/conversation/preference_dataset.h)
// for a preference objective (train/objective.h). P pairs become 2P rows, TRL's order:
// [chosen_0 .. chosen_{P-1}, rejected_0 .. rejected_{P-1}], padded (or, under a token budget,
// packed into one row) as the pixtral collator does (data/conversation/vlm_collator.h); each row carries its pair's images (pixel_values in row
// order), and batch key "preference_pairs" holds P. A pair is never split over micro-batches.
#pragma once
#include "data/dataset.h"

namespace mmtrain::conversation {

class PreferenceCollator : public Collator {
 public:
  // pack: the 2P sequences packed into one row at cu_seqlens, in the same order (token-budget
  // micro-batches, as the pixtral collator packs them), instead of 2P padded rows.
  PreferenceCollator(int64_t pad_token_id, bool pack) : pad_token_id_(pad_token_id), pack_(pack) {}
  Batch collate(const std::vector<Batch>& pairs, std::vector<at::Generator>& generators) const override;

 private:
  int64_t pad_token_id_;
  bool pack_;
};

}  // namespace mmtrain::conversation
