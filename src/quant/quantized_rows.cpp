#include "quant/quantized_rows.h"

#include "core/error.h"
#include "core/text.h"
#include "quant/dequantize_rows_cpu.h"

#include <numeric>

namespace mmtrain::quant {
namespace {

// The fp32 values of bytes [rows, 4k] read as k floats a row.
at::Tensor as_floats(const at::Tensor& bytes) {
  return bytes.contiguous().view(at::kFloat);
}

// The fewest weight rows of `in` elements that hold whole blocks.
int64_t row_group(BaseQuant kind, int64_t in) {
  return kind == BaseQuant::nf4 ? kNf4Blocksize / std::gcd(in, kNf4Blocksize) : 1;
}

}  // namespace

bool row_quantizable(BaseQuant kind, const std::vector<int64_t>& shape) {
  if (kind == BaseQuant::none || shape.size() != 2 || shape[0] < 1 || shape[1] < 1) return false;
  return shape[0] % row_group(kind, shape[1]) == 0;
}

QuantizedRowShape quantized_row_shape(BaseQuant kind, const std::vector<int64_t>& shape) {
  if (!row_quantizable(kind, shape))
    fail("a ", base_quant_name(kind), " weight of shape ", shape_str(shape),
         " does not split into rows of whole blocks (2-D, rows a multiple of ",
         shape.size() == 2 && shape[1] > 0 ? row_group(kind, shape[1]) : 1, ")");
  const int64_t group = row_group(kind, shape[1]);
  return {shape[0] / group, group * shape[1], group};
}

int64_t quantized_row_bytes(BaseQuant kind, int64_t width) {
  switch (kind) {
    case BaseQuant::nf4: return width / 2 + 4 * (width / kNf4Blocksize);
    case BaseQuant::int8:
    case BaseQuant::fp8_e4m3: return width + 4;
    case BaseQuant::none: break;
  }
  fail("quantized_row_bytes: no format (base_quant none)");
}

at::Tensor quantized_rows(const QuantizedWeight& q) {
  const QuantizedRowShape stored = quantized_row_shape(q.kind, q.shape);
  if (q.kind == BaseQuant::nf4) {  // bitsandbytes' blocks run over the flat weight: a stored row is whole ones
    const at::Tensor codes = q.nf4.packed.view({stored.rows, stored.width / 2});
    const at::Tensor absmax = nf4_block_absmax(q.nf4).contiguous().view({stored.rows, stored.width / kNf4Blocksize});
    return at::cat({codes, absmax.view(at::kByte)}, 1);
  }
  const at::Tensor codes = q.rowwise.codes.contiguous().view(at::kByte);
  return at::cat({codes, q.rowwise.scales.contiguous().view({stored.rows, 1}).view(at::kByte)}, 1);
}

at::Tensor dequantize_rows(const at::Tensor& rows, BaseQuant kind, int64_t width, at::ScalarType public_dtype,
                           at::ScalarType dtype) {
  const int64_t R = rows.size(0), row_bytes = quantized_row_bytes(kind, width);
  if (rows.dim() != 2 || rows.size(1) != row_bytes || rows.scalar_type() != at::kByte)
    fail("dequantize_rows: expected uint8 [R, ", row_bytes, "] for ", base_quant_name(kind), " rows of ", width,
         " elements, got ", rows.scalar_type(), " ", rows.sizes());
  const bool cpu_loop = (public_dtype == at::kFloat || public_dtype == at::kBFloat16) &&
                        (dtype == at::kFloat || dtype == at::kBFloat16);
  if (rows.device().is_cpu() && cpu_loop) {
    at::Tensor out = at::empty({R, width}, rows.options().dtype(dtype));
    dequantize_rows_cpu(rows.contiguous(), kind, width, public_dtype, out, fastest_cpu_dequantizer());
    return out;
  }
  at::Tensor values;
  if (kind == BaseQuant::nf4) {
    const at::Tensor packed = rows.narrow(1, 0, width / 2);
    const at::Tensor absmax = as_floats(rows.narrow(1, width / 2, 4 * (width / kNf4Blocksize)));  // [R, width / 64]
    // Codes in element order: element 2i is byte i's high nibble, 2i + 1 its low one.
    const at::Tensor codes = at::stack({packed.bitwise_right_shift(4), packed.bitwise_and(15)}, 2).view({R, width});
    const at::Tensor levels = nf4_levels_tensor().to(rows.device()).index_select(0, codes.reshape({-1}).to(at::kLong));
    values = levels.view({R, width / kNf4Blocksize, kNf4Blocksize}) * absmax.unsqueeze(2);
  } else {
    const at::Tensor codes = rows.narrow(1, 0, width).contiguous().view(kind == BaseQuant::int8 ? at::kChar : at::kFloat8_e4m3fn);
    const at::Tensor scales = as_floats(rows.narrow(1, width, 4));  // [R, 1]
    values = codes.to(at::kFloat) * scales;
    if (kind == BaseQuant::int8) values = values * kInt8Step;
  }
  return values.reshape({R, width}).to(public_dtype).to(dtype);
}

}  // namespace mmtrain::quant
