// The dtype names people write and read: the YAML's fp32 / bf16 / fp16 (and their long forms),
// used by the config, `plan`, checkpoint plans and logs alike.
#pragma once
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace mmtrain {

// fp32|float32 -> kFloat, bf16|bfloat16 -> kBFloat16, fp16|float16 -> kHalf; nullopt otherwise.
std::optional<at::ScalarType> dtype_parse(const std::string& name);
// kFloat -> "fp32", kBFloat16 -> "bf16", kHalf -> "fp16"; any other dtype by c10's name.
std::string dtype_name(at::ScalarType dtype);

}  // namespace mmtrain
