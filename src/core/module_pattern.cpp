// Parsing and whole-name matching of MindSpeed module selectors (syntax in module_pattern.h).
#include "core/module_pattern.h"

#include "core/error.h"
#include "core/text.h"
#include "core/suggest.h"

#include <algorithm>
#include <cctype>

namespace mmtrain {
namespace {

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// 18 digits always fit in uint64_t; longer bounds are not layer indices.
constexpr std::size_t kMaxDigits = 18;

}  // namespace

ModulePattern::ModulePattern(std::string pattern) : text_(std::move(pattern)) {
  if (text_.empty()) fail("module pattern '': expected a module name pattern, found an empty string");
  if (text_.size() > kMaxModulePatternChars)
    fail("module pattern '", text_.substr(0, 40), "...': ", text_.size(), " characters, over the ",
         kMaxModulePatternChars, " a module pattern may have");
  std::string literal;
  auto flush_literal = [&] {
    if (literal.empty()) return;
    Token token;
    token.literal = std::move(literal);
    tokens_.push_back(std::move(token));
    literal.clear();
  };
  for (std::size_t i = 0; i < text_.size(); ++i) {
    const char c = text_[i];
    if (c == '}') {
      fail("module pattern '", text_, "': expected '{' before the '}' at offset ", i, ", found none");
    } else if (c == '{') {
      const auto close = text_.find_first_of("{}", i + 1);
      if (close == std::string::npos || text_[close] != '}')
        fail("module pattern '", text_, "': expected '}' closing the '{' at offset ", i, ", found ",
             close == std::string::npos ? std::string("the end of the pattern") : std::string("another '{'"));
      flush_literal();
      tokens_.push_back(parse_braces(text_.substr(i + 1, close - i - 1)));
      i = close;
    } else if (c == '*' || c == '?') {
      flush_literal();
      Token token;
      token.kind = c == '*' ? Token::kAnyRun : Token::kAnyChar;
      tokens_.push_back(token);
    } else {
      literal += c;
    }
  }
  flush_literal();
}

ModulePattern::Token ModulePattern::parse_braces(const std::string& inner) const {
  Token token;
  token.kind = Token::kNumber;
  if (trim(inner) == "*") return token;
  auto malformed = [&](const std::string& why) {
    fail("module pattern '", text_, "': expected {*}, {N}, a range list like {0-20,22-40} or words like {q,k,v} ",
         "inside braces, found '{", inner, "}' (", why, ")");
  };
  std::vector<std::string> items;
  for (std::size_t start = 0;;) {
    const auto comma = inner.find(',', start);
    items.push_back(trim(inner.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (items.back().empty()) malformed("empty item");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  // A word (a module name's segment, such as q_proj) starts with a letter or '_'.
  auto is_word = [](const std::string& item) {
    if (!std::isalpha(static_cast<unsigned char>(item[0])) && item[0] != '_') return false;
    return std::all_of(item.begin(), item.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  };
  const auto words = std::count_if(items.begin(), items.end(), is_word);
  if (words > 0 && words != static_cast<std::ptrdiff_t>(items.size()))
    malformed("it mixes words and numbers");
  if (words > 0) {
    token.kind = Token::kOneOf;
    token.words = items;
    return token;
  }
  auto parse_bound = [&](const std::string& text) -> uint64_t {
    const std::string digits = trim(text);
    if (!all_digits(digits)) malformed("'" + digits + "' is not a non-negative integer");
    if (digits.size() > kMaxDigits) malformed("'" + digits + "' has more than 18 digits");
    return std::stoull(digits);
  };
  for (const auto& item : items) {
    Range range;
    const auto dash = item.find('-');
    if (dash == std::string::npos) {
      range.low = range.high = parse_bound(item);
    } else {
      range.low = parse_bound(item.substr(0, dash));
      range.high = parse_bound(item.substr(dash + 1));
      if (range.low > range.high) malformed("range '" + item + "' has low > high");
    }
    token.ranges.push_back(range);
  }
  return token;
}

bool ModulePattern::number_in_ranges(const Token& token, const std::string& digits) {
  if (token.ranges.empty()) return true;
  const auto first_nonzero = digits.find_first_not_of('0');
  if (first_nonzero != std::string::npos && digits.size() - first_nonzero > kMaxDigits) return false;
  const uint64_t value = first_nonzero == std::string::npos ? 0 : std::stoull(digits.substr(first_nonzero));
  for (const auto& range : token.ranges)
    if (range.low <= value && value <= range.high) return true;
  return false;
}

bool ModulePattern::matches(const std::string& name) const {
  // tail[t][pos]: whether tokens_[t..] match name[pos..], filled from the last token back, so the
  // cost is tokens x positions (x the digit run for numbers), with no recursion.
  const std::size_t width = name.size() + 1;
  std::vector<char> next(width, 0), here(width, 0);
  next[name.size()] = 1;  // no tokens left: only the end of the name matches
  for (std::size_t t = tokens_.size(); t-- > 0;) {
    const Token& token = tokens_[t];
    std::fill(here.begin(), here.end(), 0);
    for (std::size_t pos = width; pos-- > 0;) {
      bool matched = false;
      switch (token.kind) {
        case Token::kLiteral:
          matched = name.compare(pos, token.literal.size(), token.literal) == 0 &&
                    pos + token.literal.size() < width && next[pos + token.literal.size()];
          break;
        case Token::kAnyChar:
          matched = pos < name.size() && next[pos + 1];
          break;
        case Token::kAnyRun:  // any end at or after pos: the suffix OR, built as pos falls
          matched = next[pos] || (pos + 1 < width && here[pos + 1]);
          break;
        case Token::kNumber: {
          std::size_t end = pos;
          while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
          for (; end > pos && !matched; --end)
            matched = next[end] && number_in_ranges(token, name.substr(pos, end - pos));
          break;
        }
        case Token::kOneOf:
          for (const auto& word : token.words)
            matched = matched || (name.compare(pos, word.size(), word) == 0 && pos + word.size() < width &&
                                  next[pos + word.size()]);
          break;
      }
      here[pos] = matched;
    }
    std::swap(here, next);
  }
  return next[0];
}

bool module_pattern_matches(const std::string& pattern, const std::string& module_name) {
  return ModulePattern(pattern).matches(module_name);
}

void module_pattern_check(const std::string& pattern) { ModulePattern checked(pattern); }

namespace {
std::vector<ModulePattern> compile_all(const std::vector<std::string>& patterns) {
  std::vector<ModulePattern> compiled;
  compiled.reserve(patterns.size());
  for (const auto& pattern : patterns) compiled.emplace_back(pattern);
  return compiled;
}
}  // namespace

std::vector<std::string> modules_matching(const std::vector<std::string>& patterns,
                                          const std::vector<std::string>& module_names) {
  const auto compiled = compile_all(patterns);
  std::vector<std::string> selected;
  for (const auto& name : module_names) {
    for (const auto& pattern : compiled) {
      if (pattern.matches(name)) {
        selected.push_back(name);
        break;
      }
    }
  }
  return selected;
}

std::vector<std::string> patterns_matching_nothing(const std::vector<std::string>& patterns,
                                                   const std::vector<std::string>& module_names) {
  std::vector<std::string> unmatched;
  for (const auto& pattern : compile_all(patterns)) {
    bool any = false;
    for (const auto& name : module_names) {
      if (pattern.matches(name)) {
        any = true;
        break;
      }
    }
    if (!any) unmatched.push_back(pattern.text());
  }
  return unmatched;
}

void require_patterns_match(const std::vector<std::string>& patterns,
                            const std::vector<std::string>& module_names, const std::string& where) {
  const auto unmatched = patterns_matching_nothing(patterns, module_names);
  if (unmatched.empty()) return;
  // A handful of real names shows the naming scheme; the whole list can be thousands long.
  constexpr std::size_t kShown = 8;
  std::vector<std::string> shown(module_names.begin(),
                                 module_names.begin() + std::min(kShown, module_names.size()));
  if (module_names.size() > kShown) shown.push_back("... (" + std::to_string(module_names.size()) + " modules)");
  fail(where, ": expected every pattern to match at least one module, found none matching '",
       join_names(unmatched, "', '"), "'; module names look like: ",
       shown.empty() ? std::string("(the model has no modules)") : join_names(shown));
}

}  // namespace mmtrain
