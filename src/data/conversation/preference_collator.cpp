#include "data/conversation/preference_collator.h"

#include "core/error.h"
#include "data/conversation/vlm_collator.h"
#include "models/model.h"

namespace mmtrain::conversation {

Batch PreferenceCollator::collate(const std::vector<Batch>& pairs, std::vector<at::Generator>& generators) const {
  if (pairs.empty()) fail("preference collator: empty micro-batch");
  std::vector<Batch> rows;
  for (const char* side : {"chosen", "rejected"})
    for (const auto& pair : pairs) {
      if (!pair.count(std::string(side) + "_input_ids"))
        fail("preference collator: an item without ", side, " sequences (use dataset_type preference)");
      Batch row = {{"input_ids", batch_get(pair, std::string(side) + "_input_ids")},
                   {"labels", batch_get(pair, std::string(side) + "_labels")}};
      for (const char* key : {"pixel_values", "image_sizes"})
        if (pair.count(key)) row[key] = batch_get(pair, key);
      rows.push_back(std::move(row));
    }
  Batch out = VlmCollator(pad_token_id_, pack_).collate(rows, generators);
  out[kPreferencePairsKey] = at::tensor(static_cast<int64_t>(pairs.size()), at::kLong);
  return out;
}

namespace {

const CollatorRegistration collator("preference", [](const DataConfig& data, const ModelConfig&) {
  const int64_t pad = collate_pad_token_id(data, "preference");
  return std::make_shared<PreferenceCollator>(pad, /*pack=*/data.loader.micro_batch_tokens > 0);
});

}  // namespace

}  // namespace mmtrain::conversation
