// The 8-bit AdamW's state in an mmtrain checkpoint (optim/adamw8bit.h), per trained param, beside
// its weight (train/state.h):
//   optim.exp_avg_codes.<name>       uint8, the param's shape: this rank's rows, like the weight
//   optim.exp_avg_absmax.<name>      fp32 [ceil(numel / 256)]: each block's absmax once, written by
//                                    the rank that holds the block's first element
//   optim.exp_avg_sq_codes.<name>, optim.exp_avg_sq_absmax.<name>: the same for exp_avg_sq
//   optim.exp_avg.<name>, optim.exp_avg_sq.<name>: fp32, for params below min_8bit_size
// Blocks count from the param's first element, so any world size reads them back (a rank reads
// the absmax of every block its rows touch). These are bitsandbytes' state1 / absmax1 / state2 /
// absmax2 of the param, shaped as its optimizer state_dict holds them (convert/bnb_optimizer.h).
#pragma once
#include "checkpoint/sharded_checkpoint.h"
#include "fsdp/fully_shard.h"
#include "optim/adamw8bit.h"

#include <functional>
#include <string>
#include <vector>

namespace mmtrain {

// The checkpoint keys of a param's 8-bit state (codes, absmax) and of its fp32 moments (small
// params) for moment 0 (exp_avg) or 1 (exp_avg_sq).
std::string adamw8bit_codes_key(const std::string& param_name, int moment);
std::string adamw8bit_absmax_key(const std::string& param_name, int moment);

// This rank's shards of unit u's trained param `param` in the optimizer; each fetched tensor goes
// through checked(key, tensor) (the save's NaN/Inf check).
using CheckedTensor = std::function<at::Tensor(const std::string& key, const at::Tensor& tensor)>;
std::vector<ShardedTensor> adamw8bit_param_shards(const AdamW8bit& optimizer, size_t u, const FsdpParam& param, int rank,
                                                  const CheckedTensor& checked);

// Fails naming `what` unless every absmax is finite and >= 0 (absmax[0] is block first_block's):
// what a file the run did not write must hold before its codes mean anything.
void adamw8bit_check_absmax(const at::Tensor& absmax, int64_t first_block, const std::string& what);

// Overwrites the optimizer's state of every trained param with the checkpoint's, checking each
// tensor's dtype, shape and values (absmax finite and >= 0) first.
void adamw8bit_load(const CheckpointReader& reader, Fsdp& fsdp, AdamW8bit& optimizer, int rank);

}  // namespace mmtrain
