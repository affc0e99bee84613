#include "data/tokenizer/byte_bpe.h"

#include "core/error.h"
#include "core/json_read.h"
#include "core/regular_file.h"
#include "io/atomic_file.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <array>
#include <limits>

namespace mmtrain::tokenizer {

const char* const kTekkenPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// Length of the valid UTF-8 sequence starting at s[i], or 0 with *bad set to the length of the
// maximal invalid subpart there (the unit Python's "replace" handler turns into one U+FFFD).
size_t utf8_sequence(std::string_view s, size_t i, size_t* bad) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;  // no surrogates
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  size_t k = 1;
  for (; k <= need && i + k < s.size(); ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) break;
  }
  if (k == need + 1) return need + 1;
  *bad = k;
  return 0;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(code, buffer.data(), buffer.size());
  return reinterpret_cast<const char*>(buffer.data());
}

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  require_regular_file(path, "tokenizer file " + path, "a JSON tokenizer file");
  return json_parse_checked(file_read_text(path), "tokenizer file " + path);
}

const nlohmann::json& require(const nlohmann::json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key)) {
    fail(where, ": expected key '", key, "', found ", object.is_object() ? "an object without it" : object.type_name());
  }
  return object.at(key);
}

int64_t require_int(const nlohmann::json& object, const char* key, const std::string& where) {
  const auto& value = require(object, key, where);
  if (!value.is_number_integer()) fail(where, ".", key, ": expected an integer, found ", value.dump());
  return value.get<int64_t>();
}

std::string require_string(const nlohmann::json& object, const char* key, const std::string& where) {
  const auto& value = require(object, key, where);
  if (!value.is_string()) fail(where, ".", key, ": expected a string, found ", value.dump());
  return value.get<std::string>();
}

std::string rewrite_white_space(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += "\\p{White_Space}";
      } else if (next == 'S') {
        out += "\\P{White_Space}";
      } else {
        out += '\\';
        out += next;  // escaped pairs (including "\\\\") are copied whole
      }
    } else {
      out += pattern[i];
    }
  }
  return out;
}

struct PieceSplitter::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

PieceSplitter::PieceSplitter(const std::string& pattern, const std::string& where)
    : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  const std::string rewritten = rewrite_white_space(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (impl_->code == nullptr) {
    fail(where, ": expected a pre-tokenizer regex PCRE2 can compile, found '", pattern, "' (",
         pcre2_message(error), " at offset ", offset, " of the rewritten pattern '", rewritten, "')");
  }
  // JIT is only a speed-up; the interpreter gives the same matches when it is unavailable.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

PieceSplitter::~PieceSplitter() = default;
PieceSplitter::PieceSplitter(PieceSplitter&&) noexcept = default;
PieceSplitter& PieceSplitter::operator=(PieceSplitter&&) noexcept = default;

std::vector<std::pair<size_t, size_t>> PieceSplitter::matches(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  // Per call, so one splitter can serve several threads.
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  // Long whitespace runs backtrack deeply through `\s+(?!\S)`; the default 32 KiB JIT stack is
  // too small for them.
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_jit_stack_assign(context, nullptr, stack);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  int rc = 0;
  while (start <= text.size()) {
    rc = pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, context);
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      start = end;
    } else {
      // An empty match yields no piece; step over one character like Rust's find_iter.
      if (end >= text.size()) break;
      size_t bad = 0;
      const size_t step = utf8_sequence(text, end, &bad);
      start = end + (step ? step : bad);
    }
  }
  pcre2_jit_stack_free(stack);
  pcre2_match_context_free(context);
  pcre2_match_data_free(data);
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
    fail("pre-tokenizer regex '", pattern_, "': expected a match result, found PCRE2 error ",
         pcre2_message(rc), " at byte ", start, " of a ", text.size(), "-byte text");
  }
  return out;
}

void bpe_by_rank(std::string_view piece, const RankMap& ranks, std::vector<int32_t>& out) {
  if (piece.empty()) return;
  std::string key;
  auto rank_of = [&](size_t begin, size_t end) {
    key.assign(piece.data() + begin, end - begin);
    const auto it = ranks.find(key);
    return it == ranks.end() ? kNoRank : it->second;
  };
  const int32_t whole = rank_of(0, piece.size());
  if (whole != kNoRank) {
    out.push_back(whole);
    return;
  }
  // parts[i] = (start byte of part i, rank of part i joined with part i+1); the last entry is
  // the end sentinel. This is tiktoken's byte_pair_merge, recomputing only the neighbours.
  std::vector<std::pair<size_t, int32_t>> parts;
  parts.reserve(piece.size() + 1);
  for (size_t i = 0; i <= piece.size(); ++i) parts.emplace_back(i, kNoRank);
  for (size_t i = 0; i + 2 < parts.size(); ++i) parts[i].second = rank_of(parts[i].first, parts[i + 2].first);
  while (parts.size() > 1) {
    int32_t best = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].second < best) best = parts[i].second, at = i;  // strict: leftmost wins ties
    }
    if (best == kNoRank) break;
    parts[at].second = at + 3 < parts.size() ? rank_of(parts[at].first, parts[at + 3].first) : kNoRank;
    if (at > 0) parts[at - 1].second = rank_of(parts[at - 1].first, parts[at + 2].first);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int32_t rank = rank_of(parts[i].first, parts[i + 1].first);
    if (rank == kNoRank) {
      fail("byte-level BPE: expected every single byte to have a rank, found none for byte 0x", std::hex,
           static_cast<int>(static_cast<unsigned char>(piece[parts[i].first])));
    }
    out.push_back(rank);
  }
}

std::string base64_decode(std::string_view text, const std::string& where) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] != '='; ++i) {
    const int v = value(text[i]);
    if (v < 0) fail(where, ": expected base64, found character '", text[i], "' in '", text, "'");
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  for (; i < text.size(); ++i) {
    if (text[i] != '=') fail(where, ": expected only '=' padding at the end of base64, found '", text, "'");
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  static const char* const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (unsigned char c : bytes) {
    buffer = (buffer << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += alphabet[(buffer >> bits) & 63];
    }
  }
  if (bits > 0) out += alphabet[(buffer << (6 - bits)) & 63];
  while (out.size() % 4 != 0) out += '=';
  return out;
}

std::string utf8_decode_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    size_t bad = 0;
    const size_t n = utf8_sequence(bytes, i, &bad);
    if (n) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    }
  }
  return out;
}

size_t utf8_invalid_at(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    size_t bad = 0;
    const size_t n = utf8_sequence(text, i, &bad);
    if (!n) return i;
    i += n;
  }
  return std::string_view::npos;
}

const std::vector<std::string>& byte_level_chars() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> chars(256);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      append_utf8(chars[b], printable ? b : next++);
    }
    return chars;
  }();
  return table;
}

}  // namespace mmtrain::tokenizer
