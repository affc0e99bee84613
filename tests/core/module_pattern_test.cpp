// Module selectors: a table of names that must and must not match each pattern, malformed
// patterns, order-preserving selection and the "matches nothing" error.
#include "core/module_pattern.h"

#include "core/error.h"

#include "test_util.h"

#include <gtest/gtest.h>

#include <functional>

namespace mmtrain {
namespace {


using mmtrain::testing::error_of;

struct PatternCase {
  std::string pattern;
  std::vector<std::string> matching;
  std::vector<std::string> not_matching;
};

TEST(ModulePatternTest, MatchTable) {
  const std::vector<PatternCase> cases = {
      {"dit.block.layers.{*}",
       {"dit.block.layers.0", "dit.block.layers.39", "dit.block.layers.007"},
       {"dit.block.layers", "dit.block.layers.", "dit.block.layers.0.attn", "dit.block.layers.x",
        "xdit.block.layers.0", "dit.block.layers.1a", "dit_block.layers.0", "dit.block.layers.-1"}},
      {"layers.{0-20,22-40}",
       {"layers.0", "layers.20", "layers.22", "layers.40", "layers.07"},
       {"layers.21", "layers.41", "layers.100", "layers.", "layers.0.mlp"}},
      {"layers.{3}", {"layers.3", "layers.03"}, {"layers.2", "layers.4", "layers.33", "layers.30"}},
      {"layers.{1,5,7-9}",
       {"layers.1", "layers.5", "layers.7", "layers.8", "layers.9"},
       {"layers.0", "layers.2", "layers.6", "layers.10"}},
      {"layers.{ 0 - 2 , 4 }", {"layers.0", "layers.2", "layers.4"}, {"layers.3"}},  // spaces allowed
      {"lm_head", {"lm_head"}, {"lm_head.weight", "model.lm_head", "lm_hea", "lm_headx"}},
      // '*' crosses dots (MindSpeed's fnmatch-style star), '?' is exactly one character.
      {"vision.*", {"vision.a", "vision.a.b.c", "vision."}, {"vision", "visionx.a", "language.vision.a"}},
      {"*.mlp", {"layers.0.mlp", "a.mlp"}, {"mlp", "layers.0.mlp.fc1"}},
      {"layers.?", {"layers.1", "layers.x"}, {"layers.10", "layers."}},
      {"blocks.{*}.attn.{0-1}", {"blocks.3.attn.0", "blocks.12.attn.1"}, {"blocks.3.attn.2", "blocks.attn.0"}},
      // Digits after the brace: the number token must leave "0" for the literal.
      {"layer{*}0", {"layer10", "layer100"}, {"layer0", "layer1"}},
      {"a.{0-5}{*}", {"a.12", "a.5999"}, {"a.1", "a.62"}},
      // Brace alternation of words, as docs/lora.md writes LoRA targets.
      {"layers.{*}.self_attn.{q,k,v,o}_proj",
       {"layers.0.self_attn.q_proj", "layers.12.self_attn.o_proj"},
       {"layers.0.self_attn.qk_proj", "layers.0.self_attn._proj", "layers.0.self_attn.x_proj"}},
      {"{mlp,attn}.{*}", {"mlp.0", "attn.3"}, {"mlpattn.0", "mlp"}},
      {"a.{x}", {"a.x"}, {"a.y", "a.xx"}},
      // Huge indices never crash and never fall into a small range.
      {"layers.{0-9}", {"layers.000000000000000000000000000005"}, {"layers.99999999999999999999999999"}},
  };
  for (const auto& c : cases) {
    const ModulePattern compiled(c.pattern);
    for (const auto& name : c.matching) {
      EXPECT_TRUE(compiled.matches(name)) << c.pattern << " should match " << name;
      EXPECT_TRUE(module_pattern_matches(c.pattern, name)) << c.pattern << " vs " << name;
    }
    for (const auto& name : c.not_matching) EXPECT_FALSE(compiled.matches(name)) << c.pattern << " must not match " << name;
  }
}

TEST(ModulePatternTest, MalformedPatternsAreErrorsQuotingThePattern) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"layers.{a-}", "'a' is not a non-negative integer"},
      {"layers.{0-}", "'' is not a non-negative integer"},
      {"layers.{-3}", "'' is not a non-negative integer"},
      {"layers.{5-3}", "range '5-3' has low > high"},
      {"layers.{}", "empty item"},
      {"layers.{1,}", "empty item"},
      {"layers.{q,1}", "it mixes words and numbers"},
      {"layers.{q-k}", "'q' is not a non-negative integer"},
      {"layers.{1-2-3}", "is not a non-negative integer"},
      {"layers.{**}", "'**' is not a non-negative integer"},
      {"layers.{0-1234567890123456789}", "has more than 18 digits"},
      {"layers.{0-3", "expected '}' closing the '{' at offset 7, found the end of the pattern"},
      {"layers.{{0}}", "found another '{'"},
      {"layers.0}", "expected '{' before the '}' at offset 8"},
      {"", "found an empty string"},
  };
  for (const auto& [pattern, why] : cases) {
    const std::string message = error_of([&] { module_pattern_check(pattern); });
    EXPECT_CONTAINS(message, "module pattern '" + pattern + "'");
    EXPECT_CONTAINS(message, why);
    EXPECT_CONTAINS(error_of([&] { module_pattern_matches(pattern, "layers.0"); }), "module pattern '" + pattern + "'");
  }
  EXPECT_NO_THROW(module_pattern_check("dit.block.layers.{*}"));
}

// A pattern from a checkpoint's trainer_state.json is hostile: 300,000 '*' once overflowed the
// matcher's recursion (SIGSEGV). Patterns are bounded, and the longest allowed one of stars
// matches by a table, not a recursion.
TEST(ModulePatternTest, LongPatternsAreBoundedAndNeverRecurse) {
  EXPECT_CONTAINS(error_of([&] { module_pattern_check(std::string(300000, '*')); }),
                  "300000 characters, over the 1024 a module pattern may have");
  const ModulePattern stars(std::string(kMaxModulePatternChars - 1, '*') + "x");
  EXPECT_TRUE(stars.matches(std::string(5000, 'a') + "x"));
  EXPECT_FALSE(stars.matches(std::string(5000, 'a') + "y"));
  const ModulePattern alternating(std::string(kMaxModulePatternChars / 2, '*') + std::string(kMaxModulePatternChars / 2, '?'));
  EXPECT_FALSE(alternating.matches(std::string(kMaxModulePatternChars / 2 - 1, 'b')));
  EXPECT_TRUE(alternating.matches(std::string(kMaxModulePatternChars, 'b')));
}

TEST(ModulePatternTest, ModulesMatchingKeepsModuleOrderOnce) {
  const std::vector<std::string> names = {"embed", "layers.0", "layers.0.attn", "layers.1", "layers.2", "norm", "head"};
  // Pattern order does not reorder the result, and a name matched twice appears once.
  EXPECT_EQ(modules_matching({"head", "layers.{*}", "layers.{0-1}"}, names),
            (std::vector<std::string>{"layers.0", "layers.1", "layers.2", "head"}));
  EXPECT_TRUE(modules_matching({}, names).empty());
  EXPECT_EQ(patterns_matching_nothing({"layers.{*}", "blocks.{*}", "head", "layers.{7}"}, names),
            (std::vector<std::string>{"blocks.{*}", "layers.{7}"}));
  EXPECT_CONTAINS(error_of([&] { modules_matching({"layers.{"}, names); }), "module pattern 'layers.{'");
}

TEST(ModulePatternTest, RequirePatternsMatch) {
  const std::vector<std::string> names = {"embed", "layers.0", "layers.1"};
  EXPECT_NO_THROW(require_patterns_match({"layers.{*}", "embed"}, names, "parallel.fsdp_plan.apply_modules"));
  const std::string message =
      error_of([&] { require_patterns_match({"layers.{*}", "dit.block.layers.{*}"}, names, "parallel.fsdp_plan.apply_modules"); });
  EXPECT_CONTAINS(message, "parallel.fsdp_plan.apply_modules: expected every pattern to match at least one module");
  EXPECT_CONTAINS(message, "'dit.block.layers.{*}'");
  EXPECT_CONTAINS(message, "module names look like: embed, layers.0, layers.1");
  EXPECT_CONTAINS(error_of([&] { require_patterns_match({"x"}, {}, "where"); }), "(the model has no modules)");
}

}  // namespace
}  // namespace mmtrain
