// A frozen base weight in one of the quantized formats (features.lora.base_quant; docs/qlora.md),
// and how an HF checkpoint stores it beside the weight's key K = "<module>.weight":
//   nf4      bitsandbytes' Linear4bit (the `-bnb-4bit` checkpoints): K uint8 [ceil(n / 2), 1],
//            K.absmax uint8 [blocks], K.quant_map fp32 [16], K.nested_absmax fp32,
//            K.nested_quant_map fp32 [256], K.quant_state.bitsandbytes__nf4 (the JSON
//            {quant_type, blocksize, dtype, shape, nested_blocksize, nested_dtype, nested_offset}
//            as uint8 bytes)
//   int8     bitsandbytes' Linear8bitLt: K int8 [out, in], <module>.SCB fp32 [out],
//            <module>.weight_format uint8 0 (row-major)
//   fp8_e4m3 musubi-tuner's fp8_scaled: K float8_e4m3fn [out, in], <module>.scale_weight fp32 [out]
//            (the public dtype, which the two 8-bit layouts do not record, is the caller's)
#pragma once
#include "quant/base_quant.h"
#include "quant/nf4.h"
#include "quant/rowwise.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain::quant {

struct QuantizedWeight {
  BaseQuant kind = BaseQuant::none;
  Nf4Weight nf4;           // kind nf4
  RowwiseWeight rowwise;   // kind int8 or fp8_e4m3
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kBFloat16;  // the public dtype
};

QuantizedWeight quantize_weight(const at::Tensor& weight, BaseQuant kind);
at::Tensor dequantize_weight(const QuantizedWeight& q, at::ScalarType dtype);
// Bytes it stores (codes and scales): what the plan and the gathers count.
int64_t stored_bytes(const QuantizedWeight& q);

// The tensors an HF checkpoint holds for weight key K, in the order they are written.
std::vector<std::pair<std::string, at::Tensor>> hf_tensors(const std::string& key, const QuantizedWeight& q);
// The companion keys of K (every key but K itself) for `kind`.
std::vector<std::string> hf_companion_keys(const std::string& key, BaseQuant kind);

// How a checkpoint stores key K, from which companions it holds: none when it has none of them.
// A bitsandbytes quant_state of another quant_type (fp4) is refused naming it.
using HasKey = std::function<bool(const std::string& key)>;
using ReadKey = std::function<at::Tensor(const std::string& key)>;
BaseQuant stored_quant(const std::string& key, const HasKey& has);
// The public shape and dtype of K, from its nf4 quant_state alone (cheap: a weight is not read);
// for the 8-bit formats, stored_shape (K's own) and fp32.
struct PublicForm {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
};
PublicForm hf_public_form(const std::string& key, BaseQuant kind, const ReadKey& read,
                          const std::vector<int64_t>& stored_shape, const std::string& where);

// What a checkpoint's tensors show once each quantized weight stands for its companions: the
// names (stored order, companions left out), and each quantized weight's format and public form.
struct CheckpointView {
  std::vector<std::string> names;
  std::set<std::string> companions;  // the stored names left out of `names`
  std::map<std::string, BaseQuant> kinds;
  std::map<std::string, PublicForm> forms;
};
using StoredShape = std::function<std::vector<int64_t>(const std::string& key)>;
CheckpointView checkpoint_view(const std::vector<std::string>& stored, const HasKey& has, const ReadKey& read,
                               const StoredShape& stored_shape, const std::string& where);

// Reads and checks K's quantized tensors (sizes against the recorded shape, finite scales, a known
// quant_state: nf4, blocks of 64, double-quantized in blocks of 256; int8 rows in row-major order,
// bitsandbytes' weight_format 0); public_dtype is the 8-bit formats' (nf4 records its own), and
// their codes are refused when a value would not fit it (fp8 NaN codes, an int8 row scale that
// overflows). `where` names the checkpoint in errors.
QuantizedWeight read_hf_quantized(const std::string& key, BaseQuant kind, const HasKey& has, const ReadKey& read,
                                  at::ScalarType public_dtype, const std::string& where);

}  // namespace mmtrain::quant
