// collator_id "pixtral" (the seed's name): micro-batches for a vision-language model from
// "huggingface" conversation items (data/conversation/conversation_dataset.h).
//
// Unpacked items: the B rows are right-padded to the longest together -- input_ids with
// pad_token_id, labels with -100, attention_mask 1 on tokens / 0 on padding, position_ids
// 0..len-1 then 0 -- so all four share one length [B, S]. Padding sits after every real token
// of its row, so under causal attention it changes nothing that is supervised.
// Packed items (with cu_seqlens) need micro_batch_size 1 and pass through as one row [1, S] with
// attention_mask = segment ids 1..k (LLaMA-Factory's neat packing) next to cu_seqlens.
// With `pack` (token-budget micro-batches, data.dataloader_param.micro_batch_tokens) every
// micro-batch is packed that way, its conversations (or packed items) one after another in one row,
// so that the budget counts exactly the tokens computed (no padding); each conversation's first
// label is -100, as it is never predicted in a row of its own.
// Images of all rows are concatenated in row order, zero-padded to the largest: pixel_values
// [N, 3, H_max, W_max] and image_sizes [N, 2]; absent when the micro-batch has no image.
#pragma once
#include "data/dataset.h"

namespace mmtrain::conversation {

// Mistral's <pad> (tekken id 11), the default for the seed's Magistral runs. Any valid id would
// do: padded positions carry label -100 and follow every real token of their row.
inline constexpr int64_t kDefaultPadTokenId = 11;

// collate_param's pad_token_id (default kDefaultPadTokenId), its keys checked (model_name,
// pad_token_id) for the collator named `collator`.
int64_t collate_pad_token_id(const DataConfig& data, const std::string& collator);

class VlmCollator : public Collator {
 public:
  explicit VlmCollator(int64_t pad_token_id, bool pack = false) : pad_token_id_(pad_token_id), pack_(pack) {}
  Batch collate(const std::vector<Batch>& samples, std::vector<at::Generator>& generators) const override;

 private:
  int64_t pad_token_id_;
  bool pack_;
};

}  // namespace mmtrain::conversation
