#include "core/dtype.h"

namespace mmtrain {

std::optional<at::ScalarType> dtype_parse(const std::string& name) {
  if (name == "fp32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16") return at::kHalf;
  return std::nullopt;
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    default: return c10::toString(dtype);
  }
}

}  // namespace mmtrain
