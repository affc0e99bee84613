// The built-in rewards' comparisons (rl/answer_checks.h) on the answers models write: numbers in
// every notation the rewards accept, the answer part of a Magistral completion, its format.
#include "rl/answer_checks.h"

#include <gtest/gtest.h>

namespace mmtrain::rl {
namespace {

TEST(AnswerChecks, NumbersInEveryNotation) {
  EXPECT_EQ(parse_number("42"), 42.0);
  EXPECT_EQ(parse_number(" -3.5 "), -3.5);
  EXPECT_EQ(parse_number(".5"), 0.5);
  EXPECT_EQ(parse_number("2e3"), 2000.0);
  EXPECT_EQ(parse_number("1,234,567"), 1234567.0);
  EXPECT_EQ(parse_number("3/4"), 0.75);
  EXPECT_EQ(parse_number("\\frac{1}{2}"), 0.5);
  EXPECT_EQ(parse_number("\\dfrac{3}{4}"), 0.75);
  EXPECT_EQ(parse_number("-\\frac{1}{4}"), -0.25);
  EXPECT_EQ(parse_number("$\\boxed{7}$"), 7.0);
  EXPECT_EQ(parse_number("\\boxed{\\frac{6}{3}}"), 2.0);
  EXPECT_EQ(parse_number("50%"), 50.0);
  for (const char* not_a_number : {"", "seven", "1,2", "12,34", "1/0", "\\frac{1}{0}", "2+3", "\\frac{1}{2}x",
                                   "1.2.3", "inf", "nan", "1e999"})
    EXPECT_FALSE(parse_number(not_a_number).has_value()) << not_a_number;
}

TEST(AnswerChecks, NumbersEqualAcrossNotations) {
  EXPECT_TRUE(numbers_equal("0.5", "\\frac{1}{2}"));
  EXPECT_TRUE(numbers_equal("1,000", "1000.0"));
  EXPECT_TRUE(numbers_equal("\\boxed{3}", "3"));
  EXPECT_TRUE(numbers_equal("0.1", "1/10"));  // within the relative tolerance, not bitwise
  EXPECT_FALSE(numbers_equal("0.5", "0.51"));
  EXPECT_FALSE(numbers_equal("three", "3"));
}

TEST(AnswerChecks, TheAnswerOfACompletion) {
  EXPECT_EQ(completion_answer("  4  "), "4");
  EXPECT_EQ(completion_answer("[THINK]2+2 is 4, not \\boxed{5}[/THINK]The answer is 4."), "The answer is 4.");
  EXPECT_EQ(completion_answer("[THINK]so[/THINK]So it is \\boxed{\\frac{1}{2}} here"), "\\frac{1}{2}");
  EXPECT_EQ(completion_answer("\\boxed{a} then \\boxed{b}"), "b");  // the last box
  EXPECT_EQ(completion_answer("\\boxed{unclosed"), "\\boxed{unclosed");
}

TEST(AnswerChecks, NormalizedText) {
  EXPECT_EQ(normalize_answer("  The   Answer\nIs Red. "), "the answer is red");
  EXPECT_EQ(normalize_answer("$\\boxed{Blue}$"), "blue");
  EXPECT_NE(normalize_answer("red"), normalize_answer("reds"));
}

TEST(AnswerChecks, MagistralsThinkFormat) {
  EXPECT_TRUE(has_think_format("[THINK]It has 3 letters.[/THINK]3"));
  EXPECT_TRUE(has_think_format("  [THINK] a [/THINK] b  "));
  EXPECT_FALSE(has_think_format("3"));                                   // no reasoning
  EXPECT_FALSE(has_think_format("x[THINK]a[/THINK]b"));                  // not first
  EXPECT_FALSE(has_think_format("[THINK]a[/THINK]"));                    // no answer
  EXPECT_FALSE(has_think_format("[THINK] [/THINK]b"));                   // empty reasoning
  EXPECT_FALSE(has_think_format("[THINK]a[THINK]b[/THINK]c"));           // two opens
  EXPECT_FALSE(has_think_format("[THINK]a[/THINK]b[/THINK]c"));          // two closes
  EXPECT_FALSE(has_think_format("[THINK]never closed"));
}

}  // namespace
}  // namespace mmtrain::rl
