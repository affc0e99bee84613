// The Mistral v7+ (tekken) chat format that Magistral-Small-2509 is trained on, with SFT labels:
//
//   <s> [SYSTEM_PROMPT] sys [/SYSTEM_PROMPT]? [INST] user_1 [/INST] asst_1 </s> [INST] user_2 ...
//
// This is mistral-common's InstructTokenizerV7+ encoding (and LLaMA-Factory's `mistral_small` /
// MindSpeed-MM's `mistral` template): control tokens enter by id only; each text chunk is
// tokenized on its own; every "<image>" in a user message is replaced by that image's tokens
// ([IMG]... [IMG_BREAK] ... [IMG_END], given by the caller). Assistant text is encoded with
// trailing spaces removed, as mistral-common does (LLaMA-Factory keeps them).
//
// Labels follow LLaMA-Factory's supervised processor: per turn, source = (turn 0: <s> + system)
// + [INST] user [/INST] is -100; target = assistant + </s> is supervised, every turn.
// Truncation to cutoff_len is LLaMA-Factory's infer_seqlen per turn (see truncate_turns).
#pragma once
#include "data/chat/chat_template.h"
#include "data/tokenizer/text_tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain::chat {

class MistralChatTemplate : public ChatTemplate {
 public:
  // default_system is used when a conversation has no system message (MindSpeed-MM's `mistral`
  // template defaults it to Magistral's reasoning prompt; empty means no system block).
  MistralChatTemplate(std::shared_ptr<const tokenizer::TextTokenizer> tokenizer, std::string default_system = "");

  // image_tokens[i] replaces the i-th "<image>" of the conversation; their count must match.
  std::vector<EncodedTurn> encode(const Conversation& conversation,
                                  const std::vector<std::vector<int32_t>>& image_tokens) const override;

  const tokenizer::TextTokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::shared_ptr<const tokenizer::TextTokenizer> tokenizer_;
  std::string default_system_;
  int32_t bos_, eos_, inst_, inst_end_, system_, system_end_;
};

}  // namespace mmtrain::chat
