// MagiHuman preference data (Flow-DPO, train/objective.h): pairs of prepared clips for one caption.
//   dataset magihuman_preference: data_root is a prepared .precomputed directory (as for
//     magihuman_precomputed) and `pairs` a manifest, JSONL, one pair a line:
//       {"chosen": "STEM", "rejected": "STEM"}
//     each STEM a sample of data_root. A sample is one pair (max_samples counts pairs); its keys
//     are the two clips' (precomputed_dataset.h) under "chosen/" and "rejected/".
//   collator magihuman_preference: P pairs become 2P packed samples, [chosen_0 .. chosen_{P-1},
//     rejected_0 .. rejected_{P-1}] (models/model.h's kPreferencePairsKey holds P), noised by the
//     magihuman collator (collator.h) so that the two clips of a pair share the timestep and the
//     noise: the rejected clip draws from a copy of the chosen clip's generator, which is why both
//     clips of a pair must have one video grid and one audio length (refused by name otherwise).
// docs/preference.md.
#pragma once
#include "data/magihuman/collator.h"
#include "data/magihuman/precomputed_dataset.h"

#include <memory>
#include <string>
#include <vector>

namespace mmtrain::magihuman {

class PreferencePairsDataset : public Dataset {
 public:
  // clips: the prepared directory's samples; manifest: the pairs file. max_pairs 0: all.
  PreferencePairsDataset(std::shared_ptr<PrecomputedDataset> clips, const std::string& manifest, int64_t max_pairs);

  int64_t size() const override { return static_cast<int64_t>(pairs_.size()); }
  Batch get(int64_t index) const override;
  std::string describe(int64_t index) const override;  // "pair N (chosen STEM, rejected STEM) of MANIFEST"
  std::optional<int64_t> sample_tokens(int64_t index) const override;

 private:
  struct Pair {
    int64_t chosen, rejected;  // sample indices in clips_
    int64_t line;              // in the manifest
  };
  std::shared_ptr<PrecomputedDataset> clips_;
  std::string manifest_;
  std::vector<Pair> pairs_;
};

class PreferencePairsCollator : public Collator {
 public:
  explicit PreferencePairsCollator(PrecomputedDataOptions options) : clips_(std::move(options)) {}
  Batch collate(const std::vector<Batch>& pairs, std::vector<at::Generator>& generators) const override;

 private:
  MagiHumanCollator clips_;
};

}  // namespace mmtrain::magihuman
