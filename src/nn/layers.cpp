#include "nn/layers.h"

namespace mmtrain {

Weight::Weight(std::vector<int64_t> shape, at::ScalarType checkpoint_dtype)
    : weight(add_param("weight", std::move(shape))) {
  weight.checkpoint_dtype = checkpoint_dtype;
}

Linear::Linear(int64_t out_features, int64_t in_features, at::ScalarType checkpoint_dtype, bool with_bias)
    : Weight({out_features, in_features}, checkpoint_dtype) {
  if (!with_bias) return;
  bias = &add_param("bias", {out_features});
  bias->checkpoint_dtype = checkpoint_dtype;
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  return at::linear(x, weight.value, bias ? bias->value : at::Tensor());
}

Embedding::Embedding(int64_t vocab, int64_t dim, at::ScalarType checkpoint_dtype)
    : Weight({vocab, dim}, checkpoint_dtype) {}

Norm::Norm(int64_t dim, at::ScalarType checkpoint_dtype, NormInit init) : Weight({dim}, checkpoint_dtype) {
  weight.init_normal = false;
  weight.init_constant = init == NormInit::one ? 1.0 : 0.0;
}

}  // namespace mmtrain
