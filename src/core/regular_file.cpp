#include "core/regular_file.h"

#include "core/error.h"

#include <filesystem>

namespace mmtrain {

void require_regular_file(const std::string& path, const std::string& label, const std::string& expected) {
  if (path.find('\0') != std::string::npos)  // the label holds the path: print it up to the NUL
    fail(label.substr(0, label.find('\0')), "\\0...: the path contains a NUL byte");
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) fail(label, ": no such file");
  if (ec) fail(label, ": cannot be inspected (", ec.message(), ")");
  if (std::filesystem::is_regular_file(status)) return;
  fail(label, ": not a regular file (", std::filesystem::is_directory(status) ? "a directory" : "a FIFO, device or socket",
       "), expected ", expected);
}

void require_plain_file_name(const std::string& name, const std::string& where, const std::string& what,
                             const std::string& dir) {
  const bool plain = !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
                     name.find('\0') == std::string::npos;
  if (!plain)
    fail(where, ": refused: ", what, " is '", name.substr(0, name.find('\0')), "', which is not a plain file name inside ",
         dir, " (a checkpoint's files must stay in its directory)");
}

}  // namespace mmtrain
