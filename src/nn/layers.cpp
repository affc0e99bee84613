#include "nn/layers.h"

#include "core/error.h"
#include "nn/lora.h"

#include <cmath>

namespace mmtrain {

Weight::Weight(std::vector<int64_t> shape, at::ScalarType checkpoint_dtype)
    : weight(add_param("weight", std::move(shape))) {
  weight.checkpoint_dtype = checkpoint_dtype;
}

Linear::Linear(int64_t out_features, int64_t in_features, at::ScalarType checkpoint_dtype, bool with_bias,
               int64_t experts)
    : Weight({out_features, in_features}, checkpoint_dtype), experts_(experts) {
  if (experts < 1 || out_features % experts != 0)
    fail("Linear [", out_features, ", ", in_features, "]: ", experts, " experts do not split its rows");
  if (!with_bias) return;
  bias = &add_param("bias", {out_features});
  bias->checkpoint_dtype = checkpoint_dtype;
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  auto y = at::linear(x, weight.value, bias ? bias->value : at::Tensor());
  if (!has_lora()) return y;
  if (experts_ != 1) fail("Linear::forward on a layer of ", experts_, " experts: its model computes one expert at a time");
  return with_lora(y, x);
}

at::Tensor Linear::with_lora(const at::Tensor& y, const at::Tensor& x, int64_t expert) const {
  if (!has_lora() || !lora_adapters_on()) return y;  // off: a preference objective's reference (nn/lora.h)
  const auto& a = lora_A->weight.value;
  const auto& b = lora_B->weight.value;
  auto a_k = experts_ == 1 ? a : a.chunk(experts_, 0)[expert];  // [r, in]
  auto b_k = experts_ == 1 ? b : b.chunk(experts_, 0)[expert];  // [out / E, r]
  auto h = at::linear(x.to(a.scalar_type()), a_k) * lora_scale;  // [..., r]
  if (y.scalar_type() != b_k.scalar_type() || y.dim() < 2) return y + at::linear(h, b_k).to(y.scalar_type());
  const int64_t out = y.size(-1);
  return at::addmm(y.reshape({-1, out}), h.reshape({-1, h.size(-1)}), b_k.t()).view(y.sizes());
}

void Linear::attach_lora(int64_t rank, double scale, bool gaussian_init, at::ScalarType adapter_dtype) {
  if (has_lora()) fail("Linear: a second LoRA adapter on one layer");
  const int64_t in = in_features(), out_per_expert = out_features() / experts_;
  lora_A = add_child("lora_A", std::make_shared<Linear>(experts_ * rank, in, adapter_dtype));
  lora_B = add_child("lora_B", std::make_shared<Linear>(experts_ * out_per_expert, rank, adapter_dtype));
  lora_scale = scale;
  auto& a = lora_A->weight;
  if (gaussian_init) {  // peft's init_lora_weights="gaussian": normal(0, 1 / r)
    a.init_std = 1.0 / static_cast<double>(rank);
  } else {  // nn.Linear's default, kaiming_uniform_(a = sqrt(5)): uniform(+-1 / sqrt(in))
    a.init = Param::Init::uniform;
    a.init_bound = 1.0 / std::sqrt(static_cast<double>(in));
  }
  lora_B->weight.init = Param::Init::constant;  // zero: the adapted model starts as the base
  for (Param* p : {&a, &lora_B->weight}) p->adapter_dtype = adapter_dtype;
}

Embedding::Embedding(int64_t vocab, int64_t dim, at::ScalarType checkpoint_dtype)
    : Weight({vocab, dim}, checkpoint_dtype) {}

Norm::Norm(int64_t dim, at::ScalarType checkpoint_dtype, NormInit init) : Weight({dim}, checkpoint_dtype) {
  weight.init = Param::Init::constant;
  weight.init_constant = init == NormInit::one ? 1.0 : 0.0;
}

}  // namespace mmtrain
