// The formats a frozen base weight can be stored in (features.lora.base_quant; docs/qlora.md).
#pragma once
#include <string>

namespace mmtrain::quant {

enum class BaseQuant { none, nf4, int8, fp8_e4m3 };
// "none", "nf4", "int8", "fp8_e4m3"; parse fails naming `what` and the accepted names.
const char* base_quant_name(BaseQuant kind);
BaseQuant parse_base_quant(const std::string& text, const std::string& what);

}  // namespace mmtrain::quant
