// One interface over the two tokenizer file formats a Mistral checkpoint may ship: tekken.json
// (TekkenTokenizer) and HF tokenizer.json (HfBpeTokenizer). The chat template needs text -> ids
// and control-token ids by name; generation (`mmtrain sample`) needs ids -> text.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain::tokenizer {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // Ids of plain text, without BOS/EOS. Tekken never turns control-token strings in the text into
  // control ids; tokenizer.json does unless split_special_tokens (the `tokenizers` behaviour).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // The text of ids, control tokens skipped (mistral-common's and HF's skip_special_tokens);
  // invalid UTF-8 is replaced.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // Id of a control token ("<s>", "[INST]", "[IMG]", ...); fails naming the file when absent.
  virtual int32_t special_id(const std::string& name) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual const std::string& path() const = 0;
};

struct TextTokenizerOptions {
  bool fix_mistral_regex = false;     // tokenizer.json only (HfBpeOptions)
  bool split_special_tokens = false;  // tokenizer.json only
};

// The id of a control token the tokenizer may not have ("[THINK]", "[IMG_BREAK]"): nothing when absent.
std::optional<int32_t> special_id_if_any(const TextTokenizer& tokenizer, const std::string& name);

// `path` is a tekken.json / tokenizer.json file, or a directory holding one (tekken.json is
// preferred: it is Mistral's own format). Fails naming what was looked for.
std::shared_ptr<TextTokenizer> load_text_tokenizer(const std::string& path, const TextTokenizerOptions& options = {});

}  // namespace mmtrain::tokenizer
