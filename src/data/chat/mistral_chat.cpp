#include "data/chat/mistral_chat.h"

#include "core/error.h"

#include <algorithm>
#include <tuple>

namespace mmtrain::chat {
namespace {

void append(std::vector<int32_t>& out, const std::vector<int32_t>& ids) { out.insert(out.end(), ids.begin(), ids.end()); }

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

MistralChatTemplate::MistralChatTemplate(std::shared_ptr<const tokenizer::TextTokenizer> tokenizer,
                                         std::string default_system)
    : tokenizer_(std::move(tokenizer)), default_system_(std::move(default_system)) {
  bos_ = tokenizer_->special_id("<s>");
  eos_ = tokenizer_->special_id("</s>");
  inst_ = tokenizer_->special_id("[INST]");
  inst_end_ = tokenizer_->special_id("[/INST]");
  system_ = tokenizer_->special_id("[SYSTEM_PROMPT]");
  system_end_ = tokenizer_->special_id("[/SYSTEM_PROMPT]");
}

std::vector<EncodedTurn> MistralChatTemplate::encode(const Conversation& conversation,
                                                     const std::vector<std::vector<int32_t>>& image_tokens) const {
  if (conversation.turns.empty()) fail("chat template: a conversation needs at least one user/assistant turn");
  const int64_t placeholders = conversation.image_placeholders();
  if (placeholders != static_cast<int64_t>(image_tokens.size()))
    fail("chat template: the conversation has ", placeholders, " \"", kImagePlaceholder, "\" placeholders but ",
         image_tokens.size(), " images");
  const std::string& system = conversation.system.empty() ? default_system_ : conversation.system;
  const std::string placeholder = kImagePlaceholder;
  size_t next_image = 0;
  std::vector<EncodedTurn> out;
  for (size_t t = 0; t < conversation.turns.size(); ++t) {
    const auto& turn = conversation.turns[t];
    EncodedTurn encoded;
    auto& source = encoded.source;
    if (t == 0) {
      source.push_back(bos_);
      if (!system.empty()) {
        source.push_back(system_);
        append(source, tokenizer_->encode(system));
        source.push_back(system_end_);
      }
    }
    source.push_back(inst_);
    size_t begin = 0;
    for (size_t at = turn.user.find(placeholder); at != std::string::npos; at = turn.user.find(placeholder, begin)) {
      if (at > begin) append(source, tokenizer_->encode(turn.user.substr(begin, at - begin)));
      append(source, image_tokens[next_image++]);
      begin = at + placeholder.size();
    }
    if (begin < turn.user.size()) append(source, tokenizer_->encode(turn.user.substr(begin)));
    source.push_back(inst_end_);

    const size_t kept = turn.assistant.find_last_not_of(' ');
    const std::string answer = kept == std::string::npos ? std::string() : turn.assistant.substr(0, kept + 1);
    if (!answer.empty()) encoded.target = tokenizer_->encode(answer);
    encoded.target.push_back(eos_);
    out.push_back(std::move(encoded));
  }
  return out;
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
