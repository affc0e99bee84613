// The leaf modules every model is built from (llama.cpp's shared builders, as modules). Each
// holds one parameter "weight" (a Linear may add "bias") with the dtype the model's public
// checkpoint stores it in (Param::checkpoint_dtype: what exports and weight fixtures write) and
// the rule a fresh model initialises it by. They declare shapes only: FSDP owns the values
// (nn/module.h), and a model reads `weight.value` in its forward.
//
//   Weight     weight [any shape]            normal(0, 0.02)   (a conv kernel, a stacked table)
//   Linear     weight [out, in] (+ bias [out]) normal(0, 0.02), the bias too
//   Embedding  weight [vocab, dim]           normal(0, 0.02)
//   Norm       weight [dim]                  1 (a gain), or 0 (the zero-centred (1 + w) form)
//
// Modality-expert layers (MagiHuman) are a Linear or Norm whose rows hold the experts stacked.
#pragma once
#include "nn/module.h"

#include <memory>
#include <vector>

namespace mmtrain {

class Weight : public Module {
 public:
  Weight(std::vector<int64_t> shape, at::ScalarType checkpoint_dtype);
  Param& weight;
};

// A Linear may carry a LoRA adapter (nn/lora.h): children lora_A [E * r, in] and lora_B
// [E * out / E, r] (E = experts, each expert's rows stacked like the weight's), and its forward
// adds scale * B_k (A_k x) to expert k's output.
class Linear : public Weight {
 public:
  // experts: how many modality experts the rows of weight stack (MagiHuman), each out / experts rows.
  Linear(int64_t out_features, int64_t in_features, at::ScalarType checkpoint_dtype, bool with_bias = false,
         int64_t experts = 1);
  // x [..., in] -> [..., out]: x @ weight^T (+ bias) (+ the LoRA delta), the nn.Linear convention.
  // A Linear of several experts is computed an expert at a time by its model (with_lora).
  at::Tensor forward(const at::Tensor& x) const;
  // y + scale * B_k (A_k x), where y [..., out / experts] is expert k's output of the base weight
  // and x [..., in] its input; y itself without an adapter. The scale rides on the rank-r
  // intermediate and the second GEMM accumulates into y (addmm) when the dtypes agree, so the
  // adapter costs one pass over the output, not four.
  at::Tensor with_lora(const at::Tensor& y, const at::Tensor& x, int64_t expert = 0) const;

  // Adds the adapter's children; their params are initialised by the rules LoRA's init names.
  void attach_lora(int64_t rank, double scale, bool gaussian_init, at::ScalarType adapter_dtype);
  bool has_lora() const { return lora_A != nullptr; }
  int64_t experts() const { return experts_; }
  int64_t in_features() const { return weight.shape[1]; }
  int64_t out_features() const { return weight.shape[0]; }

  Param* bias = nullptr;
  std::shared_ptr<Linear> lora_A, lora_B;
  double lora_scale = 0.0;

 private:
  int64_t experts_;
};

class Embedding : public Weight {
 public:
  Embedding(int64_t vocab, int64_t dim, at::ScalarType checkpoint_dtype);
};

enum class NormInit {
  one,   // y = w * norm(x): the gain starts at 1
  zero,  // y = (1 + w) * norm(x): w starts at 0
};

class Norm : public Weight {
 public:
  Norm(int64_t dim, at::ScalarType checkpoint_dtype, NormInit init);
};

}  // namespace mmtrain
