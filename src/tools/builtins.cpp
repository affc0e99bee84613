#include "tools/builtins.h"

#include "models/magihuman/memory.h"

#include <mutex>

namespace mmtrain {

void register_token_file_data();

void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_token_file_data();
    magihuman::register_magihuman_plan();  // memory-plan hooks (`mmtrain plan`)
  });
}

}  // namespace mmtrain
