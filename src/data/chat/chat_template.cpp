#include "data/chat/chat_template.h"

#include <algorithm>
#include <tuple>

namespace mmtrain::chat {
namespace {

// LLaMA-Factory processor_utils.infer_seqlen: (source, target) lengths kept of a turn whose
// lengths are (source_len, target_len) within `cutoff` tokens.
std::pair<int64_t, int64_t> infer_seqlen(int64_t source_len, int64_t target_len, int64_t cutoff) {
  int64_t max_target;
  if (target_len * 2 < cutoff)
    max_target = cutoff;
  else if (source_len * 2 < cutoff)
    max_target = cutoff - source_len;
  else
    max_target = static_cast<int64_t>(static_cast<double>(cutoff) * target_len / (source_len + target_len));
  const int64_t new_target = std::min(max_target, target_len);
  const int64_t new_source = std::min(std::max<int64_t>(cutoff - new_target, 0), source_len);
  return {new_source, new_target};
}

}  // namespace

int64_t Conversation::image_placeholders() const {
  int64_t count = 0;
  for (const auto& turn : turns)
    for (size_t at = turn.user.find(kImagePlaceholder); at != std::string::npos;
         at = turn.user.find(kImagePlaceholder, at + 1))
      ++count;
  return count;
}

Registry<ChatTemplateFactory>& chat_template_registry() {
  static Registry<ChatTemplateFactory> registry("chat template");
  return registry;
}

TrainingSequence truncate_turns(const std::vector<EncodedTurn>& turns, int64_t cutoff_len) {
  TrainingSequence seq;
  int64_t total = 0;
  for (size_t t = 0; t < turns.size(); ++t) {
    const auto& turn = turns[t];
    int64_t source_len = static_cast<int64_t>(turn.source.size()), target_len = static_cast<int64_t>(turn.target.size());
    if (cutoff_len > 0) {
      if (total >= cutoff_len) {
        seq.dropped_turns = static_cast<int64_t>(turns.size() - t);
        break;
      }
      std::tie(source_len, target_len) = infer_seqlen(source_len, target_len, cutoff_len - total);
    }
    seq.input_ids.insert(seq.input_ids.end(), turn.source.begin(), turn.source.begin() + source_len);
    seq.labels.insert(seq.labels.end(), source_len, -100);
    seq.input_ids.insert(seq.input_ids.end(), turn.target.begin(), turn.target.begin() + target_len);
    seq.labels.insert(seq.labels.end(), turn.target.begin(), turn.target.begin() + target_len);
    total += source_len + target_len;
  }
  return seq;
}

}  // namespace mmtrain::chat
