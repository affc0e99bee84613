// A rank that crashes in a multi-rank job otherwise shows up only as its peers' "connection
// reset": print which signal killed this process and where, then die of that signal as before.
#pragma once

namespace mmtrain {

// Installs the handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, running on an alternate
// signal stack of the calling (main) thread, so that a stack overflow there (e.g. a parser
// recursing too deep) is reported too. Threads started later have no alternate stack: an
// overflow on one of them still dies silently. Prints
//   mmtrain: fatal signal SIGFPE (8) (arithmetic exception), backtrace:
// and the frames on stderr, then re-raises the signal with its default action.
void install_fatal_signal_handlers();

}  // namespace mmtrain
