// Batch: the named tensors a collator produces and a model's forward reads (the seeds' batch
// keys: input_ids, labels, x, coords_mapping, cu_seqlens, ...). It sits below both models/ and
// data/, which speak it to each other.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace mmtrain {

using Batch = std::map<std::string, at::Tensor>;

// batch[key]; fails naming the key and the keys the batch has when it is missing.
const at::Tensor& batch_get(const Batch& batch, const std::string& key);

}  // namespace mmtrain
