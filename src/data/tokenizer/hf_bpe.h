// HfBpeTokenizer: a HF `tokenizer.json` holding a byte-level BPE (GPT-2 / Llama-3 / Mistral
// style), run the way the `tokenizers` library runs it with add_special_tokens=False:
//   1. added tokens (`added_tokens`) are cut out of the text, leftmost-longest, first those with
//      normalized=false, then those with normalized=true (no normalizer is supported, so both
//      see the raw text); split_special_tokens leaves the special ones as plain text;
//   2. each remaining segment goes through the pre_tokenizer: Split(regex, Isolated) stages and a
//      final ByteLevel (its optional GPT-2 regex is one more Split stage), then bytes -> GPT-2 chars;
//   3. model BPE: the word is its chars; with ignore_merges a word found whole in the vocab is one
//      token; otherwise adjacent pairs are merged by lowest merge index (leftmost on ties).
// fix_mistral_regex reproduces transformers' patch for Mistral tokenizers whose tokenizer.json
// carries a Llama-3 regex: the first pre-tokenizer of the Sequence becomes
// Split(kTekkenPattern, Isolated) (a lone pre-tokenizer gets that Split put in front of it).
// Unsupported features (normalizers, lstrip/rstrip/single_word added tokens, dropout, subword
// prefixes/suffixes, byte_fallback, other pre-tokenizers) fail at load, naming the key.
#pragma once
#include "data/tokenizer/byte_bpe.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace mmtrain::tokenizer {

struct HfBpeOptions {
  bool fix_mistral_regex = false;
  // Like tokenizers' encode_special_tokens: special added tokens in the text are plain text.
  bool split_special_tokens = false;
};

class HfBpeTokenizer {
 public:
  static HfBpeTokenizer load(const std::string& path, const HfBpeOptions& options = {});

  std::vector<int32_t> encode(const std::string& text) const;
  // skip_special_tokens=True unless keep_special.
  std::string decode(const std::vector<int32_t>& ids, bool keep_special = false) const;

  // Id of an added special token by its content ("<s>", "[INST]", ...).
  int32_t special_id(const std::string& name) const;
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  // The regexes of the Split stages in order (after fix_mistral_regex).
  std::vector<std::string> split_patterns() const;

 private:
  struct AddedToken {
    std::string content;
    int32_t id = 0;
    bool special = false;
    bool normalized = false;
  };
  struct Merge {
    int32_t rank = 0;
    int32_t id = 0;
  };

  explicit HfBpeTokenizer(std::string path) : path_(std::move(path)) {}
  void encode_segment(std::string_view segment, std::vector<int32_t>& ids) const;
  void encode_word(std::string_view piece, std::vector<int32_t>& ids) const;
  // Cuts the parts not yet claimed by an added token (id -1) at the added tokens of one pass.
  void cut_added(bool normalized_pass, std::vector<std::pair<std::string_view, int32_t>>& parts) const;

  std::string path_;
  HfBpeOptions options_;
  std::vector<PieceSplitter> splits_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unordered_map<std::string, int32_t> special_ids_;
  std::vector<int32_t> byte_ids_;  // byte -> id of its GPT-2 char, -1 when not in the vocab
};

}  // namespace mmtrain::tokenizer
