// Model weights at the IO boundary: reading a public HF checkpoint (one safetensors file or a
// directory with an index) into FSDP shards through the model's hf_* adapter, with the key,
// shape and layout-conversion checks; and the sharded view of params and buffers that
// checkpoints store.
#pragma once
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "fsdp/fully_shard.h"
#include "models/model.h"

#include <memory>
#include <string>

namespace mmtrain {

// A source of full tensors by name: one safetensors file, or an HF directory.
class WeightSource {
 public:
  explicit WeightSource(const std::string& path);
  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  const SafetensorsTensorInfo& info(const std::string& name) const;
  at::Tensor read_rows(const std::string& name, int64_t begin, int64_t end) const;

 private:
  std::string path_;
  std::unique_ptr<SafetensorsFile> file_;
  std::unique_ptr<SafetensorsIndex> index_;
};

// Loads every parameter (this rank's rows) and buffer (whole) from an HF checkpoint. Missing,
// unexpected, mis-shaped or non-float keys are errors naming the key; the number of tensors
// whose layout was converted must equal model.expected_layout_conversions(). Returns that
// number (each rank logs it).
int64_t load_hf_weights(Model& model, Fsdp& fsdp, const WeightSource& source);

// Buffers of a fresh model from their init rule, on device.
void init_buffers(Model& model, at::Device device);

// Params ("model.<name>": this rank's real rows) and buffers (whole, on rank 0) for a checkpoint.
std::vector<ShardedTensor> model_sharded_tensors(Model& model, Fsdp& fsdp, int rank);

// Loads params and buffers back from a checkpoint written with model_sharded_tensors, on any
// world size. Shapes are checked against the model.
void load_checkpoint_model(Model& model, Fsdp& fsdp, const CheckpointReader& reader);

}  // namespace mmtrain
