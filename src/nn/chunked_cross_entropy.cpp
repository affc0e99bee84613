#include "nn/chunked_cross_entropy.h"

#include "core/error.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

namespace mmtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One chunk's fp32 logits [n, V] from h [n, H] and weight [V, H], divided by the sampling
// temperature (1: as they are; a division by 1 is exact).
at::Tensor chunk_logits(const at::Tensor& h, const at::Tensor& weight, double temperature) {
  auto logits = at::linear(h, weight).to(at::kFloat);
  return temperature == 1.0 ? logits : logits.div_(temperature);
}

// The rows' d CE / d logits, softmax - onehot(label), zero on ignored rows, for one chunk:
// logits recomputed (chunk_logits), fp32 [n, V].
at::Tensor cross_entropy_logit_grad(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& y,
                                    int64_t ignore_index, double temperature = 1.0) {
  auto grad_logits = at::softmax(chunk_logits(h, weight, temperature), -1);
  const auto keep = y != ignore_index;
  auto target = at::where(keep, y, at::zeros_like(y));
  grad_logits.scatter_add_(1, target.unsqueeze(1), at::full({h.size(0), 1}, -1.0, grad_logits.options()));
  return grad_logits.mul_(keep.unsqueeze(1).to(at::kFloat));
}

// Accumulates one chunk's grad_logits [n, V] (fp32) into grad_hidden's rows and grad_weight, cast
// back to hidden's dtype first as the unchunked path does.
void accumulate_chunk_grads(const at::Tensor& grad_logits, const at::Tensor& h, const at::Tensor& weight,
                            at::Tensor grad_hidden_rows, at::Tensor& grad_weight) {
  auto grad_logits_in = grad_logits.to(h.scalar_type());
  grad_hidden_rows.copy_(at::matmul(grad_logits_in, weight));
  grad_weight.addmm_(grad_logits_in.t().to(at::kFloat), h.to(at::kFloat));
}

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
        auto grad_logits = cross_entropy_logit_grad(h, weight, labels.narrow(0, begin, n), ignore_index).mul_(scale);
        accumulate_chunk_grads(grad_logits, h, weight, grad_hidden.narrow(0, begin, n), grad_weight);
      }
    }
    return {grad_hidden, grad_weight.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct ChunkedLinearLogProbs : torch::autograd::Function<ChunkedLinearLogProbs> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, int64_t chunk_rows, int64_t ignore_index, double temperature) {
    at::NoGradGuard no_grad;
    const int64_t rows = hidden.size(0);
    auto log_probs = at::zeros({rows}, hidden.options().dtype(at::kFloat));
    for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - begin);
      // -CE per row is log p(label); ignored rows give 0 (cross_entropy's reduction none).
      auto logits = chunk_logits(hidden.narrow(0, begin, n), weight, temperature);
      log_probs.narrow(0, begin, n).copy_(
          -at::cross_entropy_loss(logits, labels.narrow(0, begin, n), {}, at::Reduction::None, ignore_index));
    }
    ctx->save_for_backward({hidden, weight, labels});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["temperature"] = temperature;
    return log_probs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &labels = saved[2];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const double temperature = ctx->saved_data["temperature"].toDouble();
    // d logits / d (unscaled logits) = 1 / T.
    const auto grad = temperature == 1.0 ? grad_outputs[0].to(at::kFloat) : grad_outputs[0].to(at::kFloat) / temperature;  // [N]
    auto grad_hidden = at::zeros_like(hidden);
    auto grad_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    const int64_t rows = hidden.size(0);
    for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - begin);
      auto h = hidden.narrow(0, begin, n);
      // d log p / d logits = -(softmax - onehot), times each row's incoming gradient.
      auto grad_logits = cross_entropy_logit_grad(h, weight, labels.narrow(0, begin, n), ignore_index, temperature)
                             .mul_(grad.narrow(0, begin, n).neg().unsqueeze(1));
      accumulate_chunk_grads(grad_logits, h, weight, grad_hidden.narrow(0, begin, n), grad_weight);
    }
    return {grad_hidden, grad_weight.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The shapes both functions take: hidden [N, H], weight [V, H], labels int64 [N], chunk_rows >= 1.
void check_projection_inputs(const char* what, const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& labels, int64_t chunk_rows) {
  if (hidden.dim() != 2 || weight.dim() != 2 || hidden.size(1) != weight.size(1))
    fail(what, ": expected hidden [N, H] and weight [V, H], got ", hidden.sizes(), " and ", weight.sizes());
  if (labels.dim() != 1 || labels.size(0) != hidden.size(0) || labels.scalar_type() != at::kLong)
    fail(what, ": expected int64 labels [", hidden.size(0), "], got ", labels.scalar_type(), " ", labels.sizes());
  if (chunk_rows < 1) fail(what, ": chunk_rows must be >= 1, got ", chunk_rows);
}

}  // namespace

at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                        int64_t chunk_rows, int64_t ignore_index, double normalizer) {
  check_projection_inputs("chunked_linear_cross_entropy", hidden, weight, labels, chunk_rows);
  return ChunkedLinearCrossEntropy::apply(hidden, weight, labels, chunk_rows, ignore_index, normalizer);
}

at::Tensor chunked_linear_log_probs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                    int64_t chunk_rows, int64_t ignore_index, double temperature) {
  check_projection_inputs("chunked_linear_log_probs", hidden, weight, labels, chunk_rows);
  if (!(temperature > 0) || !std::isfinite(temperature))
    fail("chunked_linear_log_probs: temperature must be > 0 and finite, got ", temperature);
  return ChunkedLinearLogProbs::apply(hidden, weight, labels, chunk_rows, ignore_index, temperature);
}

at::Tensor chunked_linear_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                  int64_t chunk_rows, int64_t ignore_index, double temperature) {
  check_projection_inputs("chunked_linear_entropy", hidden, weight, labels, chunk_rows);
  at::NoGradGuard no_grad;
  auto entropy = at::zeros({hidden.size(0)}, hidden.options().dtype(at::kFloat));
  const auto rows = (labels != ignore_index).nonzero().view({-1});  // only the scored rows' logits
  for (int64_t begin = 0; begin < rows.size(0); begin += chunk_rows) {
    const auto picked = rows.narrow(0, begin, std::min(chunk_rows, rows.size(0) - begin));
    const auto log_p = at::log_softmax(chunk_logits(hidden.detach().index_select(0, picked), weight.detach(), temperature), -1);
    entropy.index_copy_(0, picked, -(log_p.exp() * log_p).sum(-1));
  }
  return entropy;
}

}  // namespace mmtrain
