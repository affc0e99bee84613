#include "tools/builtins.h"

#include "data/magihuman/precomputed_dataset.h"
#include "data/mistral3/pixtral_collator.h"
#include "models/magihuman/memory.h"

#include <mutex>

namespace mmtrain {

void register_token_file_data();
void register_magihuman_model();
void register_mistral3_model();

void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_token_file_data();
    register_magihuman_model();
    register_mistral3_model();
    magihuman::register_magihuman_data();
    mistral3::register_mistral3_data();
    magihuman::register_magihuman_plan();  // memory-plan hooks (`mmtrain plan`)
  });
}

}  // namespace mmtrain
