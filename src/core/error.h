// Errors that reach the user. Every message says what was expected, what was found and where
// (file, key, tensor name, rank); main() prints it and exits non-zero.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace mmtrain {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// fail("config ", path, ": unknown key '", key, "'") builds the message from its pieces.
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw Error(message.str());
}

}  // namespace mmtrain
