// Mistral3's HF adapter: parameter names are the HF keys of transformers >= 4.52; checkpoints
// saved before 4.52 use language_model.model.*, language_model.lm_head.*, vision_tower.* and
// multi_modal_projector.*, which load too (export keeps the reference directory's scheme). No
// row layout changes.
#pragma once
#include "models/hf_adapter.h"

namespace mmtrain::mistral3 {

class Mistral3HfAdapter : public HfAdapter {
 public:
  std::vector<std::string> hf_key_aliases(const std::string& param_name) const override;
};

}  // namespace mmtrain::mistral3
