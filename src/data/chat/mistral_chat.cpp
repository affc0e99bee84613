#include "data/chat/mistral_chat.h"

#include "core/error.h"

#include <algorithm>

namespace mmtrain::chat {
namespace {

void append(std::vector<int32_t>& out, const std::vector<int32_t>& ids) { out.insert(out.end(), ids.begin(), ids.end()); }

}  // namespace

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

namespace {

const StaticRegistration<ChatTemplateFactory> mistral(
    chat_template_registry(), "mistral",
    [](std::shared_ptr<const tokenizer::TextTokenizer> tokenizer, const std::string& default_system) {
      return std::unique_ptr<const ChatTemplate>(std::make_unique<MistralChatTemplate>(std::move(tokenizer), default_system));
    });

}  // namespace

}  // namespace mmtrain::chat
