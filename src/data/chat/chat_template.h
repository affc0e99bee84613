// What a conversation dataset asks of a chat format: the turns of a conversation as token ids
// with SFT labels (prompt unsupervised, answer supervised), and their truncation. Formats are
// chosen by name (data.dataset_param.basic_parameters.template) from a registry: "mistral"
// (data/chat/mistral_chat.h).
#pragma once
#include "core/registry.h"
#include "data/tokenizer/text_tokenizer.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain::chat {

constexpr const char* kImagePlaceholder = "<image>";

struct ChatTurn {
  std::string user;       // may hold "<image>" placeholders
  std::string assistant;
};

struct Conversation {
  std::string system;     // empty: no system block
  std::vector<ChatTurn> turns;

  int64_t image_placeholders() const;
};

struct EncodedTurn {
  std::vector<int32_t> source;  // prompt tokens, label -100
  std::vector<int32_t> target;  // answer + </s>, supervised
};

struct TrainingSequence {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // -100 where not supervised
  int64_t dropped_turns = 0;    // whole turns cut by truncation
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  // image_tokens[i] replaces the i-th "<image>" of the conversation; their count must match.
  virtual std::vector<EncodedTurn> encode(const Conversation& conversation,
                                          const std::vector<std::vector<int32_t>>& image_tokens) const = 0;
};

// default_system is used when a conversation has no system message (empty: no system block).
using ChatTemplateFactory = std::function<std::unique_ptr<const ChatTemplate>(
    std::shared_ptr<const tokenizer::TextTokenizer> tokenizer, const std::string& default_system)>;
// Formats register from their own file: const StaticRegistration<ChatTemplateFactory>
// reg(chat_template_registry(), "mistral", factory);
Registry<ChatTemplateFactory>& chat_template_registry();

// Concatenates the turns into one sequence of at most cutoff_len tokens (cutoff_len <= 0: no
// limit), as LLaMA-Factory's SupervisedDatasetProcessor: once the total reaches the cutoff the
// remaining turns are dropped; otherwise infer_seqlen splits the remaining budget between the
// turn's source and target and each is cut at its tail. A cut source can split an image's token
// block: callers must check image tokens afterwards (data/conversation/image_token_check.h).
TrainingSequence truncate_turns(const std::vector<EncodedTurn>& turns, int64_t cutoff_len);

}  // namespace mmtrain::chat
