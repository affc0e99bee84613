// Initial weights from a public HF checkpoint (one safetensors file or a directory with an index),
// read row range by row range into FSDP shards through the model's HF adapter, with the key,
// shape and layout-conversion checks. Checkpoints of mmtrain's own are train/state.h.
#pragma once
#include "fsdp/fully_shard.h"
#include "io/safetensors.h"
#include "models/hf_adapter.h"
#include "models/model.h"
#include "quant/quantized_weight.h"

#include <map>
#include <memory>
#include <string>

namespace mmtrain {

// A source of full tensors by name: one safetensors file, or an HF directory. A weight stored
// quantized (a `-bnb-4bit` checkpoint, or `convert quantize-base`: quant/quantized_weight.h) shows
// as one tensor under its key, in its public dtype (nf4: the one its quant_state records; the
// 8-bit formats: fp32), read dequantized; its companion tensors are not listed.
class WeightSource {
 public:
  explicit WeightSource(const std::string& path);
  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  const SafetensorsTensorInfo& info(const std::string& name) const;
  // Rows [begin, end) of name, checked finite: NaN/Inf is an error naming the tensor and its file.
  at::Tensor read_rows(const std::string& name, int64_t begin, int64_t end) const;
  at::Tensor read_full(const std::string& name) const;  // the whole tensor in its shape (0-dim too), checked finite
  std::string file_of(const std::string& name) const;  // the file holding name
  // How name is stored (none: as itself) and, when quantized, its stored form; an 8-bit weight's
  // codes are checked to fit public_dtype (quant::check_rowwise_values).
  quant::BaseQuant quantization(const std::string& name) const;
  quant::QuantizedWeight read_quantized(const std::string& name, at::ScalarType public_dtype = at::kFloat) const;

  // Every stored tensor, companions included, with its stored dtype, shape and bytes: what a
  // fingerprint covers.
  const std::vector<std::string>& stored_names() const;
  const SafetensorsTensorInfo& stored_info(const std::string& name) const;
  void for_each_data_chunk(const std::string& stored_name, const std::function<void(const char*, size_t)>& consume) const;

 private:
  bool stores(const std::string& name) const;
  at::Tensor read_stored(const std::string& name) const;

  std::string path_;
  std::unique_ptr<SafetensorsFile> file_;
  std::unique_ptr<SafetensorsIndex> index_;
  quant::CheckpointView view_;
  std::map<std::string, SafetensorsTensorInfo> quantized_infos_;  // a quantized weight's public dtype and shape
};

// The key that holds param_name in source: adapter.hf_key, else the first of its legacy aliases
// that source has; "" when none is there.
std::string source_key_of(const WeightSource& source, const HfAdapter& adapter, const std::string& param_name);

// A fingerprint of the weights at path (an HF directory or one .safetensors file), 64 hex digits:
// SHA-256 over the lines "name|dtype|shape|SHA-256 of its data" of every tensor in name order, so
// any changed element gives another value and no substituted base can be made to give the same
// one (a CRC could: it is linear in the bytes). It reads the whole base once, the tensors hashed
// on up to 16 threads. A LoRA checkpoint records its base's (train/state.h).
inline constexpr const char* kWeightsFingerprintKind = "sha256 of every byte";
std::string weights_fingerprint(const std::string& path);

// Loads every parameter (this rank's rows) and buffer (whole) from an HF checkpoint. Missing,
// unexpected, mis-shaped, non-float or non-finite tensors are errors naming the key; the number of tensors
// whose layout was converted must equal adapter.expected_layout_conversions(). LoRA matrices
// (Param::adapter_dtype) are not in an HF checkpoint: they are initialised by their rule from
// adapter_seed. Returns the number of conversions (each rank logs it).
int64_t load_hf_weights(Model& model, const HfAdapter& adapter, Fsdp& fsdp, const WeightSource& source,
                        uint64_t adapter_seed = 0);

// Buffers of a fresh model from their init rule, on device.
void init_buffers(Model& model, at::Device device);

}  // namespace mmtrain
