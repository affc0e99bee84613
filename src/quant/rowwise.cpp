#include "quant/rowwise.h"

#include "core/error.h"

namespace mmtrain::quant {
namespace {

constexpr double kFp8Max = 448.0;  // the largest finite float8_e4m3fn

void check_weight(const at::Tensor& weight, const char* what) {
  if (weight.dim() != 2 || !at::isFloatingType(weight.scalar_type()) || weight.device().type() != at::kCPU)
    fail(what, ": expected a 2-D float CPU weight [out, in], got ", weight.scalar_type(), " ", weight.sizes());
  if (!at::isfinite(weight).all().item<bool>()) fail(what, ": the weight holds NaN or Inf");
}

}  // namespace

RowwiseWeight quantize_int8_rowwise(const at::Tensor& weight) {
  check_weight(weight, "quantize_int8_rowwise");
  const at::Tensor half = weight.to(at::kHalf);
  const at::Tensor scb = std::get<0>(half.abs().max(1)).to(at::kFloat);
  // 127 / SCB as Python computes `127.0 / tensor`: reciprocal, then times 127, in fp32 (a zero row:
  // inf, and 0 * inf = NaN: such rows are zeroed below).
  const at::Tensor scaled = at::round(half * (scb.reciprocal() * 127.0).unsqueeze(1));
  const at::Tensor zero_row = scb.eq(0).unsqueeze(1);
  return {at::where(zero_row, at::zeros_like(scaled), scaled).to(at::kChar), scb};
}

RowwiseWeight quantize_fp8_rowwise(const at::Tensor& weight) {
  check_weight(weight, "quantize_fp8_rowwise");
  const at::Tensor w = weight.to(at::kFloat);
  at::Tensor scale = std::get<0>(w.abs().max(1)) / kFp8Max;
  scale = at::where(scale.eq(0), at::ones_like(scale), scale);
  return {(w / scale.unsqueeze(1)).clamp(-kFp8Max, kFp8Max).to(at::kFloat8_e4m3fn), scale};
}

at::Tensor dequantize_rowwise(const RowwiseWeight& q, at::ScalarType dtype) {
  if (q.codes.dim() != 2 || q.scales.dim() != 1 || q.scales.size(0) != q.codes.size(0) ||
      q.scales.scalar_type() != at::kFloat)
    fail("dequantize_rowwise: expected codes [out, in] and fp32 scales [out], got ", q.codes.sizes(), " and ",
         q.scales.scalar_type(), " ", q.scales.sizes());
  if (q.codes.scalar_type() == at::kChar)
    return (q.codes.to(at::kFloat) * q.scales.unsqueeze(1) * kInt8Step).to(dtype);
  if (q.codes.scalar_type() == at::kFloat8_e4m3fn) return (q.codes.to(at::kFloat) * q.scales.unsqueeze(1)).to(dtype);
  fail("dequantize_rowwise: codes must be int8 or float8_e4m3fn, got ", q.codes.scalar_type());
}

}  // namespace mmtrain::quant
