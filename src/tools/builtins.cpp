#include "tools/builtins.h"

#include <mutex>

namespace mmtrain {

void register_token_file_data();
void register_magihuman_model();

void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_token_file_data();
    register_magihuman_model();
  });
}

}  // namespace mmtrain
