#include "quant/quantized_rows.h"

#include "core/error.h"
#include "core/text.h"

namespace mmtrain::quant {
namespace {

// The fp32 values of bytes [rows, 4k] read as k floats a row.
at::Tensor as_floats(const at::Tensor& bytes) {
  return bytes.contiguous().view(at::kFloat);
}

}  // namespace

bool row_quantizable(BaseQuant kind, const std::vector<int64_t>& shape) {
  if (kind == BaseQuant::none || shape.size() != 2 || shape[0] < 1 || shape[1] < 1) return false;
  return kind != BaseQuant::nf4 || shape[1] % kNf4Blocksize == 0;
}

int64_t quantized_row_bytes(BaseQuant kind, int64_t in) {
  switch (kind) {
    case BaseQuant::nf4: return in / 2 + 4 * (in / kNf4Blocksize);
    case BaseQuant::int8:
    case BaseQuant::fp8_e4m3: return in + 4;
    case BaseQuant::none: break;
  }
  fail("quantized_row_bytes: no format (base_quant none)");
}

at::Tensor quantized_rows(const QuantizedWeight& q) {
  if (!row_quantizable(q.kind, q.shape))
    fail("quantized_rows: a ", base_quant_name(q.kind), " weight of shape ", shape_str(q.shape),
         " does not split into rows of whole blocks");
  const int64_t out = q.shape[0], in = q.shape[1];
  if (q.kind == BaseQuant::nf4) {
    const at::Tensor codes = q.nf4.packed.view({out, in / 2});
    const at::Tensor absmax = nf4_block_absmax(q.nf4).contiguous().view({out, in / kNf4Blocksize});
    return at::cat({codes, absmax.view(at::kByte)}, 1);
  }
  const at::Tensor codes = q.rowwise.codes.contiguous().view(at::kByte);
  return at::cat({codes, q.rowwise.scales.contiguous().view({out, 1}).view(at::kByte)}, 1);
}

at::Tensor dequantize_rows(const at::Tensor& rows, BaseQuant kind, int64_t in, at::ScalarType public_dtype,
                           at::ScalarType dtype) {
  const int64_t R = rows.size(0), row_bytes = quantized_row_bytes(kind, in);
  if (rows.dim() != 2 || rows.size(1) != row_bytes || rows.scalar_type() != at::kByte)
    fail("dequantize_rows: expected uint8 [R, ", row_bytes, "] for ", base_quant_name(kind), " rows of ", in,
         " elements, got ", rows.scalar_type(), " ", rows.sizes());
  at::Tensor values;
  if (kind == BaseQuant::nf4) {
    const at::Tensor packed = rows.narrow(1, 0, in / 2);
    const at::Tensor absmax = as_floats(rows.narrow(1, in / 2, 4 * (in / kNf4Blocksize)));  // [R, in / 64]
    // Codes in element order: element 2i is byte i's high nibble, 2i + 1 its low one.
    const at::Tensor codes = at::stack({packed.bitwise_right_shift(4), packed.bitwise_and(15)}, 2).view({R, in});
    const auto& level = nf4_levels();
    const at::Tensor levels =
        at::tensor(std::vector<float>(level.begin(), level.end()), at::kFloat).to(rows.device());
    values = levels.index_select(0, codes.reshape({-1}).to(at::kLong)).view({R, in / kNf4Blocksize, kNf4Blocksize}) *
             absmax.unsqueeze(2);
  } else {
    const at::Tensor codes = rows.narrow(1, 0, in).contiguous().view(kind == BaseQuant::int8 ? at::kChar : at::kFloat8_e4m3fn);
    const at::Tensor scales = as_floats(rows.narrow(1, in, 4));  // [R, 1]
    values = codes.to(at::kFloat) * scales;
    if (kind == BaseQuant::int8) values = values * static_cast<float>(1.0 / 127.0);
  }
  return values.reshape({R, in}).to(public_dtype).to(dtype);
}

}  // namespace mmtrain::quant
