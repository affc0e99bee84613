// Thread-per-rank harness for multi-rank unit tests: W threads, one in-process HashStore, one
// Gloo backend per thread. No ports, no processes.
#pragma once
#include "dist/comm.h"

#include <functional>
#include <memory>

namespace mmtrain::testing {

// Runs fn(comm) on world_size threads; rethrows the first failure on the caller's thread.
void run_ranks(int world_size, const std::function<void(Comm&)>& fn);

}  // namespace mmtrain::testing
