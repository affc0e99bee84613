// Small string helpers every layer's messages and tables use, in one place.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

// s without leading and trailing white space (space, tab, CR, LF, VT, FF).
std::string trim(const std::string& s);
// 10933616640 -> "10,933,616,640"; negative values keep their sign.
std::string with_commas(int64_t value);
// {4, 8} -> "[4, 8]": a tensor shape in messages.
std::string shape_str(const std::vector<int64_t>& shape);
// printf into a std::string: format("%.2f GFLOP", x).
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// {50, 70} -> "50,70" (separator ","): lists of lengths in tool output.
std::string join_ints(const std::vector<int64_t>& values, const std::string& separator = ",");
// s with control characters other than newline and tab escaped ("\x1b", "\r"): a message that
// quotes names from a file (keys, paths) prints them without letting them move the cursor, clear
// the screen or forge a line of the log.
std::string printable(const std::string& s);
// {"a", "b"} -> "a, b" (separator ", ").
std::string join(const std::vector<std::string>& values, const std::string& separator = ", ");

}  // namespace mmtrain
