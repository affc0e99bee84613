// `mmtrain measure cp-attention`: the forward + backward time of context-parallel attention on
// one long sample, per rank, under torchrun with ring x ulysses ranks (one process: the whole
// sequence on one rank). bench/cp_attention.sh compares the layouts against one rank as a
// fraction of ideal scaling.
#pragma once
#include <cstdint>
#include <string>

namespace mmtrain {

struct CpAttentionBench {
  int ring = 1, ulysses = 1;
  int64_t seqlen = 4096;
  int64_t heads = 8, kv_heads = 2, head_dim = 64;
  bool causal = false;
  std::string dtype = "fp32";
  int warmup = 1, repeats = 5;
};

// Prints (rank 0) one JSON line: the layout, the shape, and the median forward and
// forward + backward milliseconds over repeats (each between barriers).
void measure_cp_attention(const CpAttentionBench& options);

}  // namespace mmtrain
