#include "nn/chunked_cross_entropy.h"

#include "core/error.h"

#include <torch/csrc/autograd/custom_function.h>

namespace mmtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ChunkedLinearCrossEntropy : torch::autograd::Function<ChunkedLinearCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, int64_t chunk_rows, int64_t ignore_index, double normalizer) {
    at::NoGradGuard no_grad;
    const int64_t rows = hidden.size(0);
    const int64_t supervised = (labels != ignore_index).sum().item<int64_t>();
    auto loss_sum = at::zeros({}, hidden.options().dtype(at::kFloat));
    if (supervised > 0) {
      for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
        const int64_t n = std::min(chunk_rows, rows - begin);
        auto logits = at::linear(hidden.narrow(0, begin, n), weight).to(at::kFloat);
        loss_sum += at::cross_entropy_loss(logits, labels.narrow(0, begin, n), {}, at::Reduction::Sum, ignore_index);
      }
    }
    ctx->save_for_backward({hidden, weight, labels});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["supervised"] = supervised;
    const double divisor = normalizer > 0 ? normalizer : static_cast<double>(supervised);
    ctx->saved_data["divisor"] = divisor;
    return supervised > 0 ? loss_sum / divisor : loss_sum;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &labels = saved[2];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const int64_t supervised = ctx->saved_data["supervised"].toInt();
    auto grad_hidden = at::zeros_like(hidden);
    auto grad_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    if (supervised > 0) {
      const auto scale = grad_outputs[0].to(at::kFloat) / ctx->saved_data["divisor"].toDouble();
      const int64_t rows = hidden.size(0);
      for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
        const int64_t n = std::min(chunk_rows, rows - begin);
        auto h = hidden.narrow(0, begin, n);
        auto y = labels.narrow(0, begin, n);
        // d CE / d logits = softmax - onehot(label), zero on ignored rows.
        auto grad_logits = at::softmax(at::linear(h, weight).to(at::kFloat), -1);
        const auto keep = y != ignore_index;
        auto target = at::where(keep, y, at::zeros_like(y));
        grad_logits.scatter_add_(1, target.unsqueeze(1), at::full({n, 1}, -1.0, grad_logits.options()));
        grad_logits.mul_(keep.unsqueeze(1).to(at::kFloat)).mul_(scale);
        auto grad_logits_in = grad_logits.to(hidden.scalar_type());  // the unchunked path's cast back
        grad_hidden.narrow(0, begin, n).copy_(at::matmul(grad_logits_in, weight));
        grad_weight.addmm_(grad_logits_in.t().to(at::kFloat), h.to(at::kFloat));
      }
    }
    return {grad_hidden, grad_weight.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                        int64_t chunk_rows, int64_t ignore_index, double normalizer) {
  if (hidden.dim() != 2 || weight.dim() != 2 || hidden.size(1) != weight.size(1))
    fail("chunked_linear_cross_entropy: expected hidden [N, H] and weight [V, H], got ", hidden.sizes(), " and ",
         weight.sizes());
  if (labels.dim() != 1 || labels.size(0) != hidden.size(0) || labels.scalar_type() != at::kLong)
    fail("chunked_linear_cross_entropy: expected int64 labels [", hidden.size(0), "], got ", labels.scalar_type(), " ",
         labels.sizes());
  if (chunk_rows < 1) fail("chunked_linear_cross_entropy: chunk_rows must be >= 1, got ", chunk_rows);
  return ChunkedLinearCrossEntropy::apply(hidden, weight, labels, chunk_rows, ignore_index, normalizer);
}

}  // namespace mmtrain
