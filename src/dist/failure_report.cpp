#include "dist/failure_report.h"

#include "io/user_file.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <ctime>

#include <unistd.h>

namespace mmtrain {

bool is_peer_failure(const std::string& message) {
  for (const char* sign : {"Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out waiting",
                           "timed out", "Socket Timeout"})
    if (message.find(sign) != std::string::npos) return true;
  return false;
}

std::string with_peer_failure_hint(const std::string& message) {
  if (!is_peer_failure(message)) return message;
  return message + " (a peer rank failed or was killed first: its own error comes first in torchrun's report)";
}

void report_failure_to_launcher(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  const bool after_peer = is_peer_failure(message);
  const long long timestamp = static_cast<long long>(std::time(nullptr)) + (after_peer ? 2 : 0);
  const char* rank = std::getenv("RANK");
  const std::string shown = "mmtrain rank " + std::string(rank ? rank : "?") + ": " + with_peer_failure_hint(message);
  const nlohmann::json file = {
      {"message", {{"message", shown}, {"extraInfo", {{"py_callstack", shown}, {"timestamp", std::to_string(timestamp)}}}}}};
  // Whole or not at all: torchrun parses this file, and an empty or cut one (ENOSPC) makes it
  // print a JSONDecodeError instead of the rank's message. None is better: torchrun then reports
  // the exit code.
  try {
    write_file_no_follow(path, file.dump() + "\n", "TORCHELASTIC_ERROR_FILE");
  } catch (const std::exception&) {
    ::unlink(path);
  }
}

}  // namespace mmtrain
