#include "models/mistral3/hf_adapter.h"

namespace mmtrain::mistral3 {

std::vector<std::string> Mistral3HfAdapter::hf_key_aliases(const std::string& name) const {
  static const std::pair<std::string, std::string> renames[] = {
      {"model.language_model.", "language_model.model."},
      {"lm_head.", "language_model.lm_head."},
      {"model.vision_tower.", "vision_tower."},
      {"model.multi_modal_projector.", "multi_modal_projector."}};
  for (const auto& [current, legacy] : renames)
    if (name.rfind(current, 0) == 0) return {legacy + name.substr(current.size())};
  return {};
}

}  // namespace mmtrain::mistral3
