// Untrusted JSON: nesting is bounded before parsing (a deep header used to overflow the stack in
// the error path), brackets inside strings do not count, and errors name the source.
#include "core/json_read.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <string>

namespace mmtrain {
namespace {

TEST(JsonRead, NestingDepthIgnoresStrings) {
  EXPECT_EQ(json_nesting_depth("{}"), 1);
  EXPECT_EQ(json_nesting_depth(R"({"a": [[1], {"b": 2}]})"), 3);
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[[{{{{"})"), 1);
  EXPECT_EQ(json_nesting_depth(R"({"a": "\"[[[", "b": [1]})"), 2);  // an escaped quote does not end the string
  EXPECT_EQ(json_nesting_depth("17"), 0);
}

TEST(JsonRead, DeepNestingIsRefusedNamingTheSource) {
  const int levels = 60000;  // what crashed the safetensors error path
  const std::string deep = std::string(levels, '[') + std::string(levels, ']');
  const auto message = testing::error_of([&] { json_parse_checked(deep, "safetensors file x: header"); });
  EXPECT_CONTAINS(message, "safetensors file x: header");
  EXPECT_CONTAINS(message, "nested more than 128 levels");
  const std::string limit = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(json_parse_checked(limit, "x"));
  EXPECT_NO_THROW(ordered_json_parse_checked(limit, "x"));
  EXPECT_CONTAINS(testing::error_of([&] { json_parse_checked("[" + limit + "]", "x"); }), "nested more than 128");
  EXPECT_CONTAINS(testing::error_of([&] { ordered_json_parse_checked("{\"a\": ", "index.json"); }),
                  "index.json: not valid JSON");
}

}  // namespace
}  // namespace mmtrain
