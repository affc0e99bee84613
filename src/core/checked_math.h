// Size arithmetic on numbers that come from files and flags (sequence lengths, row counts in a
// header, token budgets, --seqlen): an int64 overflow is an error naming what was being sized,
// never a wrapped, negative size that a plan then prints as "fits".
#pragma once
#include <cstdint>
#include <string>

namespace mmtrain {

// The most tokens one sample or one micro-batch may hold, 2^32 (four hundred times the longest
// contexts trained today). Every size the plan derives from a token count (bytes per layer and
// per rank: tokens x width x a few dozen tensors x layers) stays inside int64 for any real model
// below it; an absurd model.config that still wraps is caught where the plan sums the estimate.
constexpr int64_t kMaxTokens = int64_t{1} << 32;

// a + b and a x b, or fail("<what>: <a> + <b> overflows int64") (x for the product).
int64_t checked_add(int64_t a, int64_t b, const std::string& what);
int64_t checked_mul(int64_t a, int64_t b, const std::string& what);
// tokens in [0, kMaxTokens], or fail("<what>: <tokens> tokens, more than the 2^32 ...").
int64_t checked_tokens(int64_t tokens, const std::string& what);

}  // namespace mmtrain
