// Checks every model's config reader runs on sizes before any arithmetic uses them: a 0 head count
// or head_dim would otherwise divide by zero (SIGFPE) or build empty tensors.
#pragma once
#include "core/error.h"

#include <cstdint>
#include <string>

namespace mmtrain {

// key: the path under model.config ("text_config.num_attention_heads").
inline void require_at_least(const std::string& key, int64_t value, int64_t minimum = 1) {
  if (value < minimum) fail("model.config.", key, " must be >= ", minimum, ", got ", value);
}

}  // namespace mmtrain
