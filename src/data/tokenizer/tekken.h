// TekkenTokenizer: Mistral's tekken.json (Magistral-Small-2509, Mistral-Small-3.x, Pixtral), as
// mistral-common's Tekkenizer loads and runs it (docs/tokenizer.md):
//   * ids 0..num_special-1 are special/control tokens (`special_tokens` of the file, or
//     mistral-common's 20 default ones for files <= v7 without that list, then <SPECIAL_i> fillers);
//   * ordinary tokens are the vocab ranks, truncated to vocab_size - num_special, offset by num_special;
//   * encode = split by config.pattern (PCRE2 UTF+UCP), then tiktoken BPE by rank per piece;
//     special tokens are never parsed from text: "[INST]" in user text is plain text;
//   * decode = bytes of the ordinary ids, UTF-8 decoded with replacement; special ids are
//     dropped (mistral-common's default IGNORE policy) or kept as their names.
// Control tokens enter a sequence only by id, through special_id().
#pragma once
#include "data/tokenizer/byte_bpe.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace mmtrain::tokenizer {

// mistral-common's Tekkenizer.DEPRECATED_SPECIAL_TOKENS: ids 0..19 ("<unk>", "<s>", "</s>",
// "[INST]", ...) of files up to v7 that carry no special_tokens list.
const std::vector<std::string>& tekken_default_special_tokens();

struct TekkenOptions {
  // Total vocabulary (special + ordinary). <= 0: the file's config.default_vocab_size, as
  // mistral-common's Tekkenizer.from_file uses.
  int64_t vocab_size = 0;
};

class TekkenTokenizer {
 public:
  static TekkenTokenizer load(const std::string& path, const TekkenOptions& options = {});

  // Token ids of `text` (valid UTF-8), without BOS/EOS.
  std::vector<int32_t> encode(const std::string& text) const;
  // Ordinary ids to text; special ids are skipped, or written as their names with keep_special.
  std::string decode(const std::vector<int32_t>& ids, bool keep_special = false) const;

  // Id of a special token by name ("<s>", "</s>", "[INST]", "[IMG]", ...); fails naming the file
  // when this tokenizer has no such token.
  int32_t special_id(const std::string& name) const;
  bool is_special(int32_t id) const { return id >= 0 && id < num_special_; }
  // Raw bytes of one ordinary id (empty for special ids).
  const std::string& token_bytes(int32_t id) const;

  int32_t bos_id() const { return special_id("<s>"); }
  int32_t eos_id() const { return special_id("</s>"); }
  int32_t num_special() const { return num_special_; }
  int32_t vocab_size() const { return vocab_size_; }
  const std::string& version() const { return version_; }
  const std::string& pattern() const { return splitter_.pattern(); }
  const std::vector<std::string>& special_names() const { return special_names_; }

 private:
  TekkenTokenizer(std::string path, PieceSplitter splitter)
      : path_(std::move(path)), splitter_(std::move(splitter)) {}

  std::string path_;
  PieceSplitter splitter_;
  std::string version_;
  int32_t num_special_ = 0;
  int32_t vocab_size_ = 0;
  RankMap ranks_;                      // bytes -> rank (< vocab_size - num_special)
  std::vector<std::string> rank_bytes_;  // rank -> bytes
  std::vector<std::string> special_names_;  // id -> name, size num_special
  std::unordered_map<std::string, int32_t> special_ids_;
};

}  // namespace mmtrain::tokenizer
