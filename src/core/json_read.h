// JSON read from files mmtrain did not write itself (safetensors headers, index.json,
// trainer_state.json, config.json, tokenizer.json, datasets). nlohmann parses any nesting depth,
// but printing or walking a deep value recurses, so a header nested 60k levels deep crashed the
// error path with a stack overflow. Here nesting beyond kMaxJsonDepth (serde_json's limit, which
// the Python safetensors reader inherits) is an error naming the source, before parsing.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace mmtrain {

constexpr int kMaxJsonDepth = 128;

// The deepest nesting of [ and { in text, outside strings (stops counting past limit).
int json_nesting_depth(const std::string& text, int limit = kMaxJsonDepth);

// Parses text; source names it in errors ("safetensors header of a.safetensors"). Malformed JSON
// and nesting deeper than kMaxJsonDepth are mmtrain::Errors.
nlohmann::json json_parse_checked(const std::string& text, const std::string& source);
nlohmann::ordered_json ordered_json_parse_checked(const std::string& text, const std::string& source);

// Typed fields of an object read from elsewhere: a missing key or a value of the wrong type is an
// Error naming where and the key ("<where>: 'name' must be a string, found 5"), never nlohmann's
// type_error. json_finite also refuses NaN/Inf (JSON has none, but a parser extension might).
std::string json_string(const nlohmann::json& object, const std::string& key, const std::string& where);
double json_finite(const nlohmann::json& object, const std::string& key, const std::string& where);

}  // namespace mmtrain
