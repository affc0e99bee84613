#include "core/fatal_signal.h"

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cstdlib>

namespace mmtrain {
namespace {

// Only async-signal-safe calls below: write, backtrace_symbols_fd, signal, raise. backtrace() is
// called once at install so that its first use does not load libgcc inside the handler.
void write_text(const char* text) { (void)!write(STDERR_FILENO, text, strlen(text)); }

const char* signal_name(int signal_number) {
  switch (signal_number) {
    case SIGSEGV: return "SIGSEGV (11) (invalid memory access or stack overflow)";
    case SIGBUS: return "SIGBUS (7) (bus error: a truncated mapped file or misaligned access)";
    case SIGFPE: return "SIGFPE (8) (arithmetic exception, e.g. integer division by zero)";
    case SIGILL: return "SIGILL (4) (illegal instruction)";
    case SIGABRT: return "SIGABRT (6) (abort)";
    default: return "(unknown)";
  }
}

void report_and_die(int signal_number) {
  write_text("mmtrain: fatal signal ");
  write_text(signal_name(signal_number));
  write_text(", backtrace:\n");
  void* frames[64];
  const int count = backtrace(frames, 64);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  signal(signal_number, SIG_DFL);
  raise(signal_number);
}

}  // namespace

void install_fatal_signal_handlers() {
  void* warm[1];
  (void)backtrace(warm, 1);
  // The alternate stack lives for the whole process.
  static const size_t kStackBytes = 256 * 1024;
  stack_t stack{};
  stack.ss_sp = std::malloc(kStackBytes);
  stack.ss_size = kStackBytes;
  if (stack.ss_sp) sigaltstack(&stack, nullptr);
  struct sigaction action{};
  action.sa_handler = report_and_die;
  action.sa_flags = SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(s, &action, nullptr);
}

}  // namespace mmtrain
