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

#include <vector>

namespace mmtrain {

class Weight : public Module {
 public:
  Weight(std::vector<int64_t> shape, at::ScalarType checkpoint_dtype);
  Param& weight;
};

class Linear : public Weight {
 public:
  Linear(int64_t out_features, int64_t in_features, at::ScalarType checkpoint_dtype, bool with_bias = false);
  // x [..., in] -> [..., out]: x @ weight^T (+ bias), the nn.Linear convention.
  at::Tensor forward(const at::Tensor& x) const;
  Param* bias = nullptr;
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
