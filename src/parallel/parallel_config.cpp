#include "parallel/parallel_config.h"

#include "core/config_schema.h"

namespace mmtrain {

void ParallelConfig::declare(ConfigSection<ParallelConfig>& s) {
  s.field("data_parallel_size", &ParallelConfig::data_parallel_size, AutoSizeCodec{})
      .field("fully_shard_parallel_size", &ParallelConfig::fully_shard_parallel_size, AutoSizeCodec{})
      .field("tensor_parallel_size", &ParallelConfig::tensor_parallel_size)
      .field("ring_attention_size", &ParallelConfig::ring_attention_size)
      .field("ulysses_parallel_size", &ParallelConfig::ulysses_parallel_size)
      .field("expert_parallel_size", &ParallelConfig::expert_parallel_size)
      .field("expert_fully_shard_parallel_size", &ParallelConfig::expert_fully_shard_parallel_size, AutoSizeCodec{})
      .field("timeout_s", &ParallelConfig::timeout_s)
      .check([](const ParallelConfig& c, const ConfigCheck& check) {
        check.auto_or_positive("data_parallel_size", c.data_parallel_size);
        check.auto_or_positive("fully_shard_parallel_size", c.fully_shard_parallel_size);
        check.at_least("tensor_parallel_size", c.tensor_parallel_size, 1);
        check.at_least("ring_attention_size", c.ring_attention_size, 1);
        check.at_least("ulysses_parallel_size", c.ulysses_parallel_size, 1);
        check.at_least("expert_parallel_size", c.expert_parallel_size, 1);
        check.auto_or_positive("expert_fully_shard_parallel_size", c.expert_fully_shard_parallel_size);
        check.at_least("timeout_s", c.timeout_s, 1);
      })
      .section("fsdp_plan", &ParallelConfig::fsdp_plan, FsdpConfig::declare);
}

}  // namespace mmtrain
