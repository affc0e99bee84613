// Small helpers shared by the gtest suites.
#pragma once
#include "core/error.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

// gmock is not installed; IsSubstring gives the same failure text as HasSubstr.
#define EXPECT_CONTAINS(haystack, needle) EXPECT_PRED_FORMAT2(::testing::IsSubstring, needle, haystack)

namespace mmtrain::testing {

// The message of the mmtrain::Error fn throws; "" (which then fails every EXPECT_CONTAINS) if none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mmtrain::testing
