// Module selectors of the MindSpeed-MM YAML (fsdp_plan.apply_modules, recompute_plan, ...):
// a pattern is matched against a whole dotted module name such as "dit.block.layers.7".
//
// Syntax (MindSpeed's str_match.py, plus lists and single numbers inside braces):
//   literal text   matches itself exactly ('.' is literal too);
//   {*}            one or more digits (a ModuleList index): "layers.{*}" matches "layers.12";
//   {3} {0-20,22-40} {1,5,7-9}
//                  one or more digits whose integer value is in one of the inclusive ranges;
//   {q,k,v,o}      one of the listed words (brace alternation, as a shell expands it): every
//                  item a word (a letter or '_', then letters, digits or '_'); words and
//                  numbers do not mix in one pair of braces;
//   *              any run of characters, dots included ("vision.*" matches every descendant);
//   ?              any one character.
// A name matches only when the pattern covers all of it: "layers.{*}" does not match
// "layers.1.attn" or "xlayers.1". Malformed patterns ("{a-}", "{5-3}", "{}", unbalanced
// braces) are errors that quote the pattern. A pattern is at most kMaxModulePatternChars long
// (a pattern comes from configs and from checkpoints' trainer_state.json), and matching is a
// table over (token, position), never a recursion, so no pattern can exhaust the stack.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

inline constexpr std::size_t kMaxModulePatternChars = 1024;

// A parsed pattern, for matching many names without re-parsing.
class ModulePattern {
 public:
  explicit ModulePattern(std::string pattern);  // fails on a malformed pattern
  bool matches(const std::string& module_name) const;
  const std::string& text() const { return text_; }

 private:
  struct Range {
    uint64_t low = 0, high = 0;
  };
  struct Token {
    enum Kind { kLiteral, kAnyRun, kAnyChar, kNumber, kOneOf } kind = kLiteral;
    std::string literal;               // kLiteral
    std::vector<Range> ranges;         // kNumber; empty for {*} (any value)
    std::vector<std::string> words;    // kOneOf
  };
  Token parse_braces(const std::string& inner) const;  // inside of {...}
  static bool number_in_ranges(const Token& token, const std::string& digits);

  std::string text_;
  std::vector<Token> tokens_;
};

// True when module_name matches pattern as a whole. Fails on a malformed pattern.
bool module_pattern_matches(const std::string& pattern, const std::string& module_name);

// Fails with a message quoting the pattern when it is malformed; config loading uses it so
// that a typo in a selector is reported before any model is built.
void module_pattern_check(const std::string& pattern);

// The names in module_names that match at least one pattern, in module_names order (which
// is the model's module order, not the pattern order), each name once.
std::vector<std::string> modules_matching(const std::vector<std::string>& patterns,
                                          const std::vector<std::string>& module_names);

// The patterns that match none of module_names, in pattern order.
std::vector<std::string> patterns_matching_nothing(const std::vector<std::string>& patterns,
                                                   const std::vector<std::string>& module_names);

// Fails when some pattern matches no module: a selector that selects nothing is almost always
// a typo, but whether it is fatal is the caller's choice (so this is separate from matching).
// where names the config key, e.g. "parallel.fsdp_plan.apply_modules"; the message lists a
// few module names so the user can see the naming scheme.
void require_patterns_match(const std::vector<std::string>& patterns,
                            const std::vector<std::string>& module_names, const std::string& where);

}  // namespace mmtrain
