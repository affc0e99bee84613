#include "core/json_read.h"

#include "core/error.h"

#include <cmath>

namespace mmtrain {
namespace {

template <typename Json>
Json parse_checked(const std::string& text, const std::string& source) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    fail(source, ": JSON nested more than ", kMaxJsonDepth, " levels deep; refused (no valid file nests that deep)");
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(source, ": not valid JSON: ", e.what());
  } catch (const nlohmann::json::exception& e) {  // a number out of range (1e400): out_of_range.406
    fail(source, ": refused: ", e.what());
  }
}

}  // namespace

int json_nesting_depth(const std::string& text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

nlohmann::json json_parse_checked(const std::string& text, const std::string& source) {
  return parse_checked<nlohmann::json>(text, source);
}

nlohmann::ordered_json ordered_json_parse_checked(const std::string& text, const std::string& source) {
  return parse_checked<nlohmann::ordered_json>(text, source);
}

std::string json_string(const nlohmann::json& object, const std::string& key, const std::string& where) {
  if (!object.is_object() || !object.contains(key)) fail(where, ": '", key, "' is missing");
  const auto& value = object[key];
  if (!value.is_string()) fail(where, ": '", key, "' must be a string, found ", value.dump());
  return value.get<std::string>();
}

double json_finite(const nlohmann::json& object, const std::string& key, const std::string& where) {
  if (!object.is_object() || !object.contains(key)) fail(where, ": '", key, "' is missing");
  const auto& value = object[key];
  if (!value.is_number()) fail(where, ": '", key, "' must be a number, found ", value.dump());
  const double x = value.get<double>();
  if (!std::isfinite(x)) fail(where, ": '", key, "' must be finite, found ", value.dump());
  return x;
}

}  // namespace mmtrain
