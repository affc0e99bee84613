// `mmtrain fixture ...`: the data and weights tests, benchmarks and the demo use, generated so
// that nothing is ever downloaded.
//   fixture NAME ...            the data sets that datasets register (core/cli_command.h)
//   fixture MODEL-weights ...   random weights in the model's public HF layout, for every model
//                               spec
#pragma once
#include "models/hf_adapter.h"
#include "models/model.h"

#include <cstdint>
#include <string>

namespace mmtrain {

// Random weights for model in its public HF layout: shards model-0000i-of-0000K.safetensors
// split by cumulative bytes, plus model.safetensors.index.json. Names come from the adapter,
// shapes and on-disk dtypes from the Module tree (Param::checkpoint_dtype); the values are drawn
// as the HF tensors themselves (a row re-layout of i.i.d. values would change nothing). Every
// trainable tensor is N(0, 0.02) (norms too: a model using 1 + w stays near its neutral value);
// buffers take their init rule (fixed RoPE bands come out exact). Each tensor comes from its own
// generator (seed, tensor index), so the values do not depend on the shard count; at most one
// shard is held in memory. shards 0 = min(7, tensors).
void write_weights_fixture(Model& model, const HfAdapter& adapter, const std::string& out_dir, int64_t shards,
                           uint64_t seed);

}  // namespace mmtrain
