// ParallelConfig: the `parallel` section, the degrees of every parallel dimension MindSpeed's
// YAML can name and the FSDP plan. Which degrees mmtrain runs is decided where they are used
// (config/config.h lists the ones it refuses); the arithmetic between them and the world size is
// parallel/parallel_dims.h's.
#pragma once
#include "fsdp/fsdp_config.h"

namespace mmtrain {

struct ParallelConfig {
  int data_parallel_size = 0;                  // 0 = "auto": world / (tp * ulysses * ring); else must equal it
  int fully_shard_parallel_size = 0;           // 0 = "auto": world / tensor_parallel_size (FSDP shards over dp x cp)
  int tensor_parallel_size = 1;
  int ring_attention_size = 1;
  int ulysses_parallel_size = 1;
  int expert_parallel_size = 1;
  int expert_fully_shard_parallel_size = 1;    // 0 = "auto": world / expert_parallel_size
  // How long a collective (and the rendezvous) may wait for its peers before failing: a hung or
  // dead rank is reported after this, not never. Checkpoint saves wait at barriers while rank 0
  // commits, so it must exceed the longest save.
  int timeout_s = 600;
  FsdpConfig fsdp_plan;

  static void declare(ConfigSection<ParallelConfig>& section);
};

}  // namespace mmtrain
