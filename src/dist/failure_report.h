// What a failing rank tells torchrun. torchrun gives every worker a TORCHELASTIC_ERROR_FILE and,
// when workers fail, reports the one whose error file has the earliest timestamp as the "Root
// Cause". Without a file it takes each rank's exit time, so the rank that merely lost its peer
// (and exited a moment earlier) was often blamed. Each rank writes its message there; a rank
// whose error is a lost connection to a peer writes its timestamp 2 s later, so that the rank
// that failed first is the one torchrun shows.
#pragma once
#include <string>

namespace mmtrain {

// True for the errors a rank sees when a peer died: a collective failing with a closed or reset
// connection, or timing out.
bool is_peer_failure(const std::string& message);
// message, and for a peer failure the hint that the peer's own error is the one to read.
std::string with_peer_failure_hint(const std::string& message);

// Writes the torchelastic error file when running under torchrun (no-op otherwise).
void report_failure_to_launcher(const std::string& message);

}  // namespace mmtrain
