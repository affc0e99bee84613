#include "rl/answer_checks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace mmtrain::rl {

namespace {

constexpr const char* kThinkOpen = "[THINK]";
constexpr const char* kThinkClose = "[/THINK]";

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The content of the braces that open at s[open] ('{'), or nothing when they do not close.
std::optional<std::string> braced(const std::string& s, size_t open) {
  if (open >= s.size() || s[open] != '{') return std::nullopt;
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return s.substr(open + 1, i - open - 1);
  }
  return std::nullopt;
}

// s without one wrapping "\boxed{...}" or "$...$" layer at a time.
std::string unwrap(std::string s) {
  while (true) {
    s = trim(s);
    if (s.size() >= 2 && s.front() == '$' && s.back() == '$') {
      s = s.substr(1, s.size() - 2);
      continue;
    }
    if (starts_with(s, "\\boxed{")) {
      const auto inner = braced(s, 6);
      if (inner && 7 + inner->size() + 1 == s.size()) {
        s = *inner;
        continue;
      }
    }
    return s;
  }
}

// A plain decimal number (sign, digits with optional thousands commas, fraction, exponent) that is
// the whole of s.
std::optional<double> parse_decimal(std::string s) {
  s = trim(s);
  if (s.empty()) return std::nullopt;
  // Thousands commas only between groups of three digits: "1,234" is 1234, "1,2" is not a number.
  std::string plain;
  size_t digits_since_comma = 0;
  bool seen_comma = false, seen_point = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == ',') {
      if (seen_point || (seen_comma && digits_since_comma != 3) || digits_since_comma == 0) return std::nullopt;
      seen_comma = true;
      digits_since_comma = 0;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) ++digits_since_comma;
    else if (c == '.' || c == 'e' || c == 'E') {
      if (seen_comma && digits_since_comma != 3) return std::nullopt;
      seen_point = true;
    }
    plain += c;
  }
  if (seen_comma && !seen_point && digits_since_comma != 3) return std::nullopt;
  for (const char c : plain)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E'))
      return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(plain.c_str(), &end);
  if (end != plain.c_str() + plain.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<double> ratio(std::optional<double> numerator, std::optional<double> denominator) {
  if (!numerator || !denominator || *denominator == 0.0) return std::nullopt;
  return *numerator / *denominator;
}

}  // namespace

std::string completion_answer(const std::string& completion) {
  std::string answer = completion;
  if (const auto close = answer.rfind(kThinkClose); close != std::string::npos)
    answer = answer.substr(close + std::string(kThinkClose).size());
  if (const auto boxed = answer.rfind("\\boxed{"); boxed != std::string::npos)
    if (const auto inner = braced(answer, boxed + 6)) return trim(*inner);
  return trim(answer);
}

std::string normalize_answer(const std::string& text) {
  std::string out;
  bool space = false;
  for (const char c : unwrap(text)) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

std::optional<double> parse_number(const std::string& text) {
  std::string s = unwrap(text);
  if (!s.empty() && s.back() == '%') s = trim(s.substr(0, s.size() - 1));
  bool negative = false;
  if (starts_with(s, "-\\")) {  // -\frac{1}{2}
    negative = true;
    s = s.substr(1);
  }
  for (const char* command : {"\\frac{", "\\dfrac{", "\\tfrac{"}) {
    if (!starts_with(s, command)) continue;
    const size_t first = std::string(command).size() - 1;
    const auto numerator = braced(s, first);
    if (!numerator) return std::nullopt;
    const size_t second = first + numerator->size() + 2;
    const auto denominator = braced(s, second);
    if (!denominator || second + denominator->size() + 2 != s.size()) return std::nullopt;
    const auto value = ratio(parse_decimal(*numerator), parse_decimal(*denominator));
    if (value && negative) return -*value;
    return value;
  }
  if (negative) return std::nullopt;
  if (const auto slash = s.find('/'); slash != std::string::npos)
    return ratio(parse_decimal(s.substr(0, slash)), parse_decimal(s.substr(slash + 1)));
  return parse_decimal(s);
}

bool numbers_equal(const std::string& a, const std::string& b) {
  const auto x = parse_number(a), y = parse_number(b);
  if (!x || !y) return false;
  const double scale = std::max(std::abs(*x), std::abs(*y));
  return std::abs(*x - *y) <= std::max(1e-12, 1e-9 * scale);
}

bool has_think_format(const std::string& completion) {
  const std::string open = kThinkOpen, close = kThinkClose;
  const std::string text = trim(completion);
  if (!starts_with(text, open)) return false;
  const auto close_at = text.find(close);
  if (close_at == std::string::npos) return false;
  if (text.find(open, open.size()) != std::string::npos || text.find(close, close_at + 1) != std::string::npos)
    return false;
  const std::string reasoning = trim(text.substr(open.size(), close_at - open.size()));
  const std::string answer = trim(text.substr(close_at + close.size()));
  return !reasoning.empty() && !answer.empty();
}

}  // namespace mmtrain::rl
