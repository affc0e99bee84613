#include "core/checked_math.h"

#include "core/error.h"

namespace mmtrain {

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) fail(what, ": ", a, " + ", b, " overflows int64");
  return sum;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) fail(what, ": ", a, " x ", b, " overflows int64");
  return product;
}

int64_t checked_tokens(int64_t tokens, const std::string& what) {
  if (tokens < 0 || tokens > kMaxTokens)
    fail(what, ": ", tokens, " tokens, ", tokens < 0 ? "negative" : "more than the 2^32 a sample or micro-batch may hold");
  return tokens;
}

}  // namespace mmtrain
