#include "fsdp/fsdp_config.h"

#include "core/config_schema.h"

namespace mmtrain {

void FsdpConfig::declare(ConfigSection<FsdpConfig>& s) {
  s.field("apply_modules", &FsdpConfig::apply_modules)
      .field("ignored_modules", &FsdpConfig::ignored_modules)
      .field("param_dtype", &FsdpConfig::param_dtype)
      .field("reduce_dtype", &FsdpConfig::reduce_dtype)
      .field("reshard_after_forward", &FsdpConfig::reshard_after_forward)
      .field("num_to_forward_prefetch", &FsdpConfig::num_to_forward_prefetch)
      .field("num_to_backward_prefetch", &FsdpConfig::num_to_backward_prefetch)
      .field("cpu_offload", &FsdpConfig::cpu_offload)
      .check([](const FsdpConfig& c, const ConfigCheck& check) {
        check.at_least("num_to_forward_prefetch", c.num_to_forward_prefetch, 0);
        check.at_least("num_to_backward_prefetch", c.num_to_backward_prefetch, 0);
        check.module_patterns("apply_modules", c.apply_modules);
        check.module_patterns("ignored_modules", c.ignored_modules);
      });
}

}  // namespace mmtrain
