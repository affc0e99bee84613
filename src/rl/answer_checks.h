// What the built-in rewards (rl/rewards.h) compare: the answer part of a completion and the
// equality of two answers, as text or as numbers.
#pragma once
#include <optional>
#include <string>

namespace mmtrain::rl {

// The answer a completion gives: the text after its last "[/THINK]" (Magistral writes its reasoning
// between [THINK] and [/THINK], then the answer), and of that the content of its last \boxed{...}
// when it has one; trimmed.
std::string completion_answer(const std::string& completion);

// Text for comparison: lower case, whitespace runs as one space, trimmed, without one trailing
// '.', and without surrounding '$' (a LaTeX inline formula around a plain answer).
std::string normalize_answer(const std::string& text);

// The value of a number written as an integer, a decimal (1.5, -.5, 2e3, 1,234 with thousands
// commas), a fraction a/b, a LaTeX \frac{a}{b} / \dfrac{a}{b} / \tfrac{a}{b}, or a percentage
// (50%: 0.5 is NOT assumed; "50%" is 50), optionally inside $...$ or \boxed{...}; nothing for
// anything else (text, an expression, a division by zero).
std::optional<double> parse_number(const std::string& text);

// Whether two answers are equal as numbers (both parse; relative difference <= 1e-9, or absolute
// <= 1e-12 near zero).
bool numbers_equal(const std::string& a, const std::string& b);

// Magistral's format: the completion begins with "[THINK]", has exactly one "[THINK]" and one
// "[/THINK]" after it, non-blank reasoning between them, and a non-blank answer after "[/THINK]".
bool has_think_format(const std::string& completion);

}  // namespace mmtrain::rl
