#include "data/tokenizer/hf_bpe.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>

namespace mmtrain::tokenizer {

namespace {

// Ids index the id -> token table: a negative id would write outside it, and one near 2^31
// would allocate tens of GB. The largest real vocabularies are ~260K ids.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

int32_t token_id(const nlohmann::json& id, const std::string& where) {
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxTokenId)
    fail(where, ": expected a token id in [0, ", kMaxTokenId, "), found ", id.dump());
  return static_cast<int32_t>(id.get<int64_t>());
}

// tokenizers' ByteLevel(use_regex=true) split, the GPT-2 pattern.
const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

bool flag(const nlohmann::json& object, const char* key) {
  return object.contains(key) && object.at(key).is_boolean() && object.at(key).get<bool>();
}

void require_absent_or_empty(const nlohmann::json& object, const char* key, const std::string& where) {
  if (!object.contains(key) || object.at(key).is_null()) return;
  const auto& value = object.at(key);
  if (value.is_string() && value.get<std::string>().empty()) return;
  fail(where, ".", key, ": expected null (not supported by this byte-level BPE), found ", value.dump());
}

// Regex escape for Split patterns given as {"String": ...}.
std::string escape_literal(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// The leftmost-longest occurrence of any added token in `text` from `from` (what tokenizers'
// aho-corasick LeftmostLongest finds); {npos, 0} when none. `by_first_byte` buckets the tokens.
std::pair<size_t, size_t> find_added(std::string_view text, size_t from,
                                     const std::vector<std::vector<const std::string*>>& by_first_byte) {
  for (size_t at = from; at < text.size(); ++at) {
    size_t best = 0;
    for (const auto* token : by_first_byte[static_cast<unsigned char>(text[at])]) {
      if (token->size() > best && text.compare(at, token->size(), *token) == 0) best = token->size();
    }
    if (best) return {at, best};
  }
  return {std::string_view::npos, 0};
}

}  // namespace

HfBpeTokenizer HfBpeTokenizer::load(const std::string& path, const HfBpeOptions& options) {
  nlohmann::json file = read_json_file(path);
  const std::string where = "tokenizer.json " + path;
  HfBpeTokenizer tok(path);
  tok.options_ = options;

  if (file.contains("normalizer") && !file.at("normalizer").is_null()) {
    fail(where, ".normalizer: expected null (normalizers are not supported), found type ",
         file.at("normalizer").value("type", std::string("?")));
  }

  // Model: vocab, merges.
  const auto& model = require(file, "model", where);
  const std::string mwhere = where + " model";
  const std::string type = require_string(model, "type", mwhere);
  if (type != "BPE") fail(mwhere, ".type: expected \"BPE\", found \"", type, "\"");
  require_absent_or_empty(model, "dropout", mwhere);
  require_absent_or_empty(model, "continuing_subword_prefix", mwhere);
  require_absent_or_empty(model, "end_of_word_suffix", mwhere);
  if (flag(model, "byte_fallback")) fail(mwhere, ".byte_fallback: expected false (not supported), found true");
  tok.ignore_merges_ = flag(model, "ignore_merges");
  const auto& vocab = require(model, "vocab", mwhere);
  if (!vocab.is_object()) fail(mwhere, ".vocab: expected an object token -> id, found ", vocab.type_name());
  auto note_token = [&tok](const std::string& token, int32_t id) {
    if (id >= static_cast<int32_t>(tok.id_to_token_.size())) tok.id_to_token_.resize(static_cast<size_t>(id) + 1);
    tok.id_to_token_[id] = token;
  };
  for (const auto& [token, id] : vocab.items()) {
    const int32_t checked = token_id(id, mwhere + ".vocab[\"" + token + "\"]");
    tok.vocab_.emplace(token, checked);
    note_token(token, checked);
  }
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    const auto it = tok.vocab_.find(model.at("unk_token").get<std::string>());
    if (it == tok.vocab_.end()) fail(mwhere, ".unk_token: expected a token of the vocab, found ", model.at("unk_token").dump());
    tok.unk_id_ = it->second;
  }
  const auto& merges = require(model, "merges", mwhere);
  if (!merges.is_array()) fail(mwhere, ".merges: expected an array, found ", merges.type_name());
  tok.merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& merge = merges[rank];
    const std::string rwhere = mwhere + ".merges[" + std::to_string(rank) + "]";
    std::string left, right;
    if (merge.is_string()) {  // "a b"
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        fail(rwhere, ": expected \"left right\" with one space, found \"", text, "\"");
      }
      left = text.substr(0, space), right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>(), right = merge[1].get<std::string>();
    } else {
      fail(rwhere, ": expected \"left right\" or [left, right], found ", merge.dump());
    }
    auto id_of = [&](const std::string& token) {
      const auto it = tok.vocab_.find(token);
      if (it == tok.vocab_.end()) fail(rwhere, ": expected tokens of the vocab, found \"", token, "\" missing");
      return static_cast<uint64_t>(it->second);
    };
    const uint64_t key = id_of(left) << 32 | id_of(right);
    const auto merged = static_cast<int32_t>(id_of(left + right));
    // tokenizers collects the merges into a map, so a repeated pair keeps its last rank.
    tok.merges_[key] = Merge{static_cast<int32_t>(rank), merged};
  }

  // Added tokens (special or not): cut out of the text before pre-tokenization.
  if (file.contains("added_tokens") && file.at("added_tokens").is_array()) {
    const auto& added = file.at("added_tokens");
    for (size_t i = 0; i < added.size(); ++i) {
      const std::string awhere = where + " added_tokens[" + std::to_string(i) + "]";
      AddedToken token;
      token.content = require_string(added[i], "content", awhere);
      token.id = token_id(require(added[i], "id", awhere), awhere + ".id");
      token.special = flag(added[i], "special");
      token.normalized = flag(added[i], "normalized");
      for (const char* unsupported : {"lstrip", "rstrip", "single_word"}) {
        if (flag(added[i], unsupported)) {
          fail(awhere, ".", unsupported, ": expected false (not supported), found true for \"", token.content, "\"");
        }
      }
      if (token.content.empty()) fail(awhere, ".content: expected a non-empty token, found \"\"");
      note_token(token.content, token.id);
      tok.added_by_id_[token.id] = tok.added_.size();
      if (token.special) tok.special_ids_[token.content] = token.id;
      tok.added_.push_back(std::move(token));
    }
  }

  // Pre-tokenizer: [Split...] then ByteLevel, optionally patched like transformers does.
  nlohmann::json pre = file.contains("pre_tokenizer") ? file.at("pre_tokenizer") : nlohmann::json();
  if (options.fix_mistral_regex) {
    const nlohmann::json split = {{"type", "Split"},
                                  {"pattern", {{"Regex", kTekkenPattern}}},
                                  {"behavior", "Isolated"},
                                  {"invert", false}};
    if (pre.is_object() && pre.value("type", std::string()) == "Sequence" && pre.contains("pretokenizers") &&
        pre.at("pretokenizers").is_array() && !pre.at("pretokenizers").empty()) {
      pre["pretokenizers"][0] = split;
    } else {
      pre = {{"type", "Sequence"}, {"pretokenizers", nlohmann::json::array({split, pre})}};
    }
  }
  const std::string pwhere = where + " pre_tokenizer";
  if (!pre.is_object()) fail(pwhere, ": expected a ByteLevel or Sequence pre-tokenizer, found ", pre.dump());
  const nlohmann::json stages =
      pre.value("type", std::string()) == "Sequence" ? require(pre, "pretokenizers", pwhere) : nlohmann::json::array({pre});
  bool byte_level = false;
  for (size_t i = 0; i < stages.size(); ++i) {
    const auto& stage = stages[i];
    const std::string swhere = pwhere + "[" + std::to_string(i) + "]";
    const std::string stype = stage.is_object() ? stage.value("type", std::string()) : std::string();
    if (byte_level) fail(swhere, ": expected ByteLevel to be the last pre-tokenizer, found ", stype, " after it");
    if (stype == "Split") {
      const auto& pattern = require(stage, "pattern", swhere);
      std::string regex;
      if (pattern.contains("Regex")) {
        regex = require_string(pattern, "Regex", swhere + ".pattern");
      } else {
        regex = escape_literal(require_string(pattern, "String", swhere + ".pattern"));
      }
      const std::string behavior = stage.value("behavior", std::string());
      if (behavior != "Isolated") fail(swhere, ".behavior: expected \"Isolated\" (the only one supported), found \"", behavior, "\"");
      if (flag(stage, "invert")) fail(swhere, ".invert: expected false (not supported), found true");
      tok.splits_.emplace_back(regex, swhere + ".pattern");
    } else if (stype == "ByteLevel") {
      if (flag(stage, "add_prefix_space")) fail(swhere, ".add_prefix_space: expected false (not supported), found true");
      if (!stage.contains("use_regex") || flag(stage, "use_regex")) tok.splits_.emplace_back(kGpt2Pattern, swhere);
      byte_level = true;
    } else {
      fail(swhere, ": expected a Split or ByteLevel pre-tokenizer, found ", stage.dump().substr(0, 200));
    }
  }
  if (!byte_level) fail(pwhere, ": expected a ByteLevel pre-tokenizer (only byte-level BPE is supported), found none");

  tok.byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    const auto it = tok.vocab_.find(byte_level_chars()[b]);
    if (it != tok.vocab_.end()) tok.byte_ids_[b] = it->second;
  }
  return tok;
}

std::vector<std::string> HfBpeTokenizer::split_patterns() const {
  std::vector<std::string> out;
  for (const auto& split : splits_) out.push_back(split.pattern());
  return out;
}

void HfBpeTokenizer::cut_added(bool normalized_pass, std::vector<std::pair<std::string_view, int32_t>>& parts) const {
  std::vector<std::vector<const std::string*>> tokens(256);
  bool any = false;
  for (const auto& token : added_) {
    if (token.normalized == normalized_pass && !(token.special && options_.split_special_tokens)) {
      tokens[static_cast<unsigned char>(token.content[0])].push_back(&token.content);
      any = true;
    }
  }
  std::vector<std::pair<std::string_view, int32_t>> out;
  for (const auto& [segment, id] : parts) {
    if (id >= 0 || !any) {
      out.emplace_back(segment, id);
      continue;
    }
    size_t from = 0;
    while (true) {
      const auto [at, length] = find_added(segment, from, tokens);
      if (at == std::string_view::npos) break;
      if (at > from) out.emplace_back(segment.substr(from, at - from), -1);
      const std::string content(segment.substr(at, length));
      const auto it = std::find_if(added_.begin(), added_.end(), [&](const AddedToken& t) {
        return t.content == content && t.normalized == normalized_pass;
      });
      out.emplace_back(segment.substr(at, length), it->id);
      from = at + length;
    }
    if (from < segment.size()) out.emplace_back(segment.substr(from), -1);
  }
  parts.swap(out);
}

std::vector<int32_t> HfBpeTokenizer::encode(const std::string& text) const {
  if (const size_t bad = utf8_invalid_at(text); bad != std::string::npos) {
    fail("HF BPE encode (", path_, "): expected UTF-8 text, found an invalid byte at offset ", bad);
  }
  std::vector<std::pair<std::string_view, int32_t>> parts{{std::string_view(text), -1}};
  cut_added(false, parts);
  cut_added(true, parts);
  std::vector<int32_t> ids;
  for (const auto& [segment, id] : parts) {
    if (id >= 0) {
      ids.push_back(id);
    } else {
      encode_segment(segment, ids);
    }
  }
  return ids;
}

void HfBpeTokenizer::encode_segment(std::string_view segment, std::vector<int32_t>& ids) const {
  // Isolated Split: matches and the gaps between them both become pieces.
  std::vector<std::string_view> pieces{segment};
  for (const auto& split : splits_) {
    std::vector<std::string_view> next;
    for (const auto piece : pieces) {
      size_t from = 0;
      for (const auto& [begin, end] : split.matches(piece)) {
        if (begin > from) next.push_back(piece.substr(from, begin - from));
        next.push_back(piece.substr(begin, end - begin));
        from = end;
      }
      if (from < piece.size()) next.push_back(piece.substr(from));
    }
    pieces.swap(next);
  }
  for (const auto piece : pieces) encode_word(piece, ids);
}

void HfBpeTokenizer::encode_word(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  const auto& chars = byte_level_chars();
  if (ignore_merges_) {
    std::string mapped;
    for (const char c : piece) mapped += chars[static_cast<unsigned char>(c)];
    if (const auto it = vocab_.find(mapped); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (const char c : piece) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    // tokenizers uses the unk token for a char outside the vocab, or drops it when there is none.
    if (id >= 0) {
      symbols.push_back(id);
    } else if (unk_id_ >= 0) {
      symbols.push_back(unk_id_);
    }
  }
  while (symbols.size() > 1) {
    int32_t best = std::numeric_limits<int32_t>::max(), merged = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = merges_.find(static_cast<uint64_t>(symbols[i]) << 32 | static_cast<uint64_t>(symbols[i + 1]));
      if (it != merges_.end() && it->second.rank < best) best = it->second.rank, merged = it->second.id, at = i;
    }
    if (merged < 0) break;
    symbols[at] = merged;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

std::string HfBpeTokenizer::decode(const std::vector<int32_t>& ids, bool keep_special) const {
  static const std::unordered_map<std::string, char> reverse = [] {
    std::unordered_map<std::string, char> map;
    for (int b = 0; b < 256; ++b) map[byte_level_chars()[b]] = static_cast<char>(b);
    return map;
  }();
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() ) fail("HF BPE (", path_, "): expected a token id in [0, ", vocab_size(), "), found ", id);
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end() && added_[it->second].special && !keep_special) continue;
    const std::string& token = id_to_token_[id];
    // ByteLevel decoder: a token whose every char is in the byte alphabet becomes those bytes,
    // any other token (an added token such as "[INST]") is kept as its text.
    std::string decoded;
    bool all_mapped = true;
    for (size_t i = 0; i < token.size() && all_mapped;) {
      const auto lead = static_cast<unsigned char>(token[i]);
      const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      const auto it = reverse.find(token.substr(i, n));
      if (it == reverse.end()) {
        all_mapped = false;
      } else {
        decoded += it->second;
      }
      i += n;
    }
    bytes += all_mapped ? decoded : token;
  }
  return utf8_decode_lossy(bytes);
}

int32_t HfBpeTokenizer::special_id(const std::string& name) const {
  const auto it = special_ids_.find(name);
  if (it == special_ids_.end()) {
    fail("tokenizer.json ", path_, ": expected a special added token '", name, "', found none among its ",
         special_ids_.size(), " special tokens");
  }
  return it->second;
}

}  // namespace mmtrain::tokenizer
