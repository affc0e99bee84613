// Byte-level BPE building blocks shared by the tekken and HF tokenizer.json loaders:
//   * PieceSplitter: a pre-tokenizer regex run with PCRE2 (UTF + UCP), returning the
//     non-overlapping leftmost matches like Rust's find_iter (tiktoken, HF tokenizers).
//   * bpe_by_rank: tiktoken's merge rule (merge the adjacent pair whose concatenated bytes have
//     the lowest rank, leftmost on ties) over one piece.
//   * base64_decode, utf8_decode_lossy (Python's errors="replace"), byte-level (GPT-2) char map.
// Plain C++17: no torch headers here (this directory is compiled without the torch PCH).
#pragma once
#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mmtrain::tokenizer {

// The pre-tokenizer pattern of tekken.json and of HF's fix_mistral_regex patch.
extern const char* const kTekkenPattern;

// Compiles `pattern` (Rust/Oniguruma regex syntax as written in tokenizer files) with PCRE2.
// `\s` and `\S` are rewritten to \p{White_Space} / \P{White_Space}: PCRE2's UCP `\s` also
// matches U+180E, which Rust regex (tiktoken) and Oniguruma (HF tokenizers) do not.
// `where` names the file and key for error messages.
class PieceSplitter {
 public:
  PieceSplitter(const std::string& pattern, const std::string& where);
  ~PieceSplitter();
  PieceSplitter(PieceSplitter&&) noexcept;
  PieceSplitter& operator=(PieceSplitter&&) noexcept;

  // Byte ranges [begin, end) of the non-empty leftmost matches in `text` (valid UTF-8), in order.
  std::vector<std::pair<size_t, size_t>> matches(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

// The regex with `\s`/`\S` replaced as described above (exposed for tests).
std::string rewrite_white_space(const std::string& pattern);

using RankMap = std::unordered_map<std::string, int32_t>;

// tiktoken's byte-pair encoding of one piece; every byte of `piece` must have a rank (tekken
// guarantees ranks 0..255 are the single bytes). Appends the ranks of the final parts to `out`.
void bpe_by_rank(std::string_view piece, const RankMap& ranks, std::vector<int32_t>& out);

// Standard base64 (RFC 4648, with padding); fails naming `where` on bad input.
std::string base64_decode(std::string_view text, const std::string& where);
std::string base64_encode(std::string_view bytes);

// Decodes UTF-8 bytes, replacing each maximal invalid subsequence with U+FFFD exactly as
// Python's bytes.decode("utf-8", errors="replace") does (the references decode this way).
std::string utf8_decode_lossy(std::string_view bytes);

// Index of the first byte of `text` that is not valid UTF-8, or npos.
size_t utf8_invalid_at(std::string_view text);

// Tokenizer files are JSON; these fail with the file and key named.
nlohmann::json read_json_file(const std::string& path);
const nlohmann::json& require(const nlohmann::json& object, const char* key, const std::string& where);
int64_t require_int(const nlohmann::json& object, const char* key, const std::string& where);
std::string require_string(const nlohmann::json& object, const char* key, const std::string& where);

// GPT-2 byte-level alphabet (HF ByteLevel): byte -> the UTF-8 of its stand-in code point.
const std::vector<std::string>& byte_level_chars();

}  // namespace mmtrain::tokenizer
