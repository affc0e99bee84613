#include "data/tokenizer/tekken.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <fstream>
#include <sstream>

namespace mmtrain::tokenizer {

namespace {

const char* const kDefaultSpecialTokens[] = {
    "<unk>",   "<s>",        "</s>",          "[INST]",          "[/INST]",
    "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]",
    "[IMG]",   "<pad>",      "[IMG_BREAK]",   "[IMG_END]",       "[PREFIX]",
    "[MIDDLE]", "[SUFFIX]",  "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
};

// "v13" -> 13. mistral-common rejects versions it does not list; we accept any vN so that a
// newer file only fails where its content differs.
int version_number(const std::string& version, const std::string& where) {
  if (version.size() < 2 || version[0] != 'v') fail(where, ": expected a version like \"v13\", found \"", version, "\"");
  size_t digits = 1;
  while (digits < version.size() && std::isdigit(static_cast<unsigned char>(version[digits]))) ++digits;
  if (digits == 1) fail(where, ": expected a version like \"v13\", found \"", version, "\"");
  return std::stoi(version.substr(1, digits - 1));
}

}  // namespace

const std::vector<std::string>& tekken_default_special_tokens() {
  static const std::vector<std::string> names(std::begin(kDefaultSpecialTokens), std::end(kDefaultSpecialTokens));
  return names;
}

TekkenTokenizer TekkenTokenizer::load(const std::string& path, const TekkenOptions& options) {
  const nlohmann::json file = read_json_file(path);
  const std::string where = "tekken file " + path;
  const auto& config = require(file, "config", where);
  const std::string cwhere = where + " config";
  TekkenTokenizer tok(path, PieceSplitter(require_string(config, "pattern", cwhere), cwhere + ".pattern"));
  tok.version_ = require_string(config, "version", cwhere);
  const int version = version_number(tok.version_, cwhere + ".version");
  const int64_t num_special = require_int(config, "default_num_special_tokens", cwhere);
  const int64_t vocab_size =
      options.vocab_size > 0 ? options.vocab_size : require_int(config, "default_vocab_size", cwhere);
  const auto& vocab = require(file, "vocab", where);
  if (!vocab.is_array()) fail(where, ".vocab: expected an array, found ", vocab.type_name());
  if (num_special <= 0 || vocab_size <= num_special || vocab_size > static_cast<int64_t>(vocab.size()) + num_special) {
    fail(where, ": expected num_special_tokens < vocab_size <= len(vocab) + num_special_tokens, found num_special_tokens ",
         num_special, ", vocab_size ", vocab_size, ", len(vocab) ", vocab.size());
  }
  tok.num_special_ = static_cast<int32_t>(num_special);
  tok.vocab_size_ = static_cast<int32_t>(vocab_size);

  // Special tokens: the file's list (required after v7, like mistral-common), then fillers.
  if (file.contains("special_tokens") && !file.at("special_tokens").is_null()) {
    const auto& specials = file.at("special_tokens");
    if (!specials.is_array()) fail(where, ".special_tokens: expected an array, found ", specials.type_name());
    for (size_t i = 0; i < specials.size(); ++i) {
      const std::string swhere = where + " special_tokens[" + std::to_string(i) + "]";
      const int64_t rank = require_int(specials[i], "rank", swhere);
      // mistral-common indexes its special list by id when decoding, so rank must equal position.
      if (rank != static_cast<int64_t>(i)) fail(swhere, ": expected rank ", i, ", found ", rank);
      tok.special_names_.push_back(require_string(specials[i], "token_str", swhere));
    }
  } else if (version > 7) {
    fail(where, ": expected a special_tokens list (required for tokenizer versions after v7), found none in version ",
         tok.version_);
  } else {
    tok.special_names_ = tekken_default_special_tokens();
  }
  if (static_cast<int64_t>(tok.special_names_.size()) > num_special) {
    fail(where, ": expected at most default_num_special_tokens=", num_special, " special tokens, found ",
         tok.special_names_.size());
  }
  for (int64_t i = static_cast<int64_t>(tok.special_names_.size()); i < num_special; ++i) {
    tok.special_names_.push_back("<SPECIAL_" + std::to_string(i) + ">");
  }
  for (int32_t id = 0; id < tok.num_special_; ++id) {
    if (!tok.special_ids_.emplace(tok.special_names_[id], id).second) {
      fail(where, ": expected unique special token names, found '", tok.special_names_[id], "' twice (id ", id, ")");
    }
  }

  // Ordinary vocabulary, truncated to the first vocab_size - num_special ranks.
  const size_t inner = static_cast<size_t>(vocab_size - num_special);
  tok.rank_bytes_.reserve(inner);
  tok.ranks_.reserve(inner * 2);
  for (size_t i = 0; i < inner; ++i) {
    const std::string vwhere = where + " vocab[" + std::to_string(i) + "]";
    const int64_t rank = require_int(vocab[i], "rank", vwhere);
    if (rank != static_cast<int64_t>(i)) fail(vwhere, ": expected rank ", i, ", found ", rank);
    std::string bytes = base64_decode(require_string(vocab[i], "token_bytes", vwhere), vwhere + ".token_bytes");
    if (i < 256 && (bytes.size() != 1 || static_cast<unsigned char>(bytes[0]) != i)) {
      fail(vwhere, ": expected the single byte ", i, " (ranks 0..255 are the bytes), found ", bytes.size(), " bytes");
    }
    if (bytes.empty()) fail(vwhere, ": expected non-empty token bytes, found none");
    if (!tok.ranks_.emplace(bytes, static_cast<int32_t>(i)).second) {
      fail(vwhere, ": expected unique token bytes, found the bytes of rank ", tok.ranks_.at(bytes), " again");
    }
    tok.rank_bytes_.push_back(std::move(bytes));
  }
  return tok;
}

std::vector<int32_t> TekkenTokenizer::encode(const std::string& text) const {
  if (const size_t bad = utf8_invalid_at(text); bad != std::string::npos) {
    fail("tekken encode (", path_, "): expected UTF-8 text, found an invalid byte at offset ", bad);
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // tiktoken encodes only the regex matches; the tekken pattern matches every character.
  for (const auto& [begin, end] : splitter_.matches(text)) {
    const size_t first = ids.size();
    bpe_by_rank(std::string_view(text).substr(begin, end - begin), ranks_, ids);
    for (size_t i = first; i < ids.size(); ++i) ids[i] += num_special_;
  }
  return ids;
}

const std::string& TekkenTokenizer::token_bytes(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= vocab_size_) {
    fail("tekken (", path_, "): expected a token id in [0, ", vocab_size_, "), found ", id);
  }
  return id < num_special_ ? kEmpty : rank_bytes_[id - num_special_];
}

std::string TekkenTokenizer::decode(const std::vector<int32_t>& ids, bool keep_special) const {
  // Like mistral-common: runs of ordinary ids are decoded as one byte string each, so a UTF-8
  // character split over several tokens survives, but not one split by a special token.
  std::string out, run;
  for (const int32_t id : ids) {
    if (is_special(id)) {
      out += utf8_decode_lossy(run);
      run.clear();
      if (keep_special) out += special_names_[id];
    } else {
      run += token_bytes(id);
    }
  }
  out += utf8_decode_lossy(run);
  return out;
}

int32_t TekkenTokenizer::special_id(const std::string& name) const {
  const auto it = special_ids_.find(name);
  if (it == special_ids_.end()) {
    fail("tekken file ", path_, ": expected a special token named '", name, "', found none among its ",
         num_special_, " special tokens");
  }
  return it->second;
}

}  // namespace mmtrain::tokenizer
