#include "quant/quantized_rows.h"

#include "core/error.h"
#include "core/text.h"

#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/bit_cast.h>

#include <array>
#include <cstring>

namespace mmtrain::quant {
namespace {

// The fp32 values of bytes [rows, 4k] read as k floats a row.
at::Tensor as_floats(const at::Tensor& bytes) {
  return bytes.contiguous().view(at::kFloat);
}

// nf4 rows on the CPU, straight into the output: each byte's two levels from a 256-entry table,
// times the block's scale (the same fp32 product as the ATen path), rounded once to the public
// dtype and converted to the output's. Rows in parallel.
template <typename Public, typename Out>
void dequantize_nf4_rows_cpu(const uint8_t* rows, int64_t R, int64_t in, Out* out) {
  const auto& level = nf4_levels();
  std::array<std::array<float, 2>, 256> pair;
  for (int b = 0; b < 256; ++b) pair[b] = {level[b >> 4], level[b & 15]};
  const int64_t row_bytes = quantized_row_bytes(BaseQuant::nf4, in), blocks = in / kNf4Blocksize;
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* codes = rows + r * row_bytes;
      Out* o = out + r * in;
      for (int64_t b = 0; b < blocks; ++b) {
        float scale;
        std::memcpy(&scale, codes + in / 2 + 4 * b, 4);  // the row's fp32 scales follow its codes (unaligned)
        for (int64_t i = 0; i < kNf4Blocksize / 2; ++i) {
          const auto& two = pair[codes[b * kNf4Blocksize / 2 + i]];
          o[b * kNf4Blocksize + 2 * i] = static_cast<Out>(static_cast<Public>(two[0] * scale));
          o[b * kNf4Blocksize + 2 * i + 1] = static_cast<Out>(static_cast<Public>(two[1] * scale));
        }
      }
    }
  });
}

// int8 and fp8 rows on the CPU: each code's fp32 value (a 256-entry table) times the row's scale,
// (times fp32(1/127) for int8), the same fp32 products as the ATen path, rounded once to the
// public dtype and converted to the output's.
template <typename Public, typename Out>
void dequantize_8bit_rows_cpu(const uint8_t* rows, int64_t R, int64_t in, BaseQuant kind, Out* out) {
  std::array<float, 256> value;
  for (int c = 0; c < 256; ++c) {
    const uint8_t byte = static_cast<uint8_t>(c);
    value[c] = kind == BaseQuant::int8 ? static_cast<float>(static_cast<int8_t>(byte))
                                       : static_cast<float>(c10::bit_cast<c10::Float8_e4m3fn>(byte));
  }
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* codes = rows + r * (in + 4);
      float scale;
      std::memcpy(&scale, codes + in, 4);
      Out* o = out + r * in;
      if (kind == BaseQuant::int8)
        for (int64_t i = 0; i < in; ++i) o[i] = static_cast<Out>(static_cast<Public>(value[codes[i]] * scale * kInt8Step));
      else
        for (int64_t i = 0; i < in; ++i) o[i] = static_cast<Out>(static_cast<Public>(value[codes[i]] * scale));
    }
  });
}

// The CPU paths for the output dtypes they write (fp32, bf16); false: go through ATen.
template <typename Public>
bool dequantize_rows_cpu_to(const at::Tensor& rows, BaseQuant kind, int64_t in, at::Tensor& out) {
  const uint8_t* data = rows.data_ptr<uint8_t>();
  const int64_t R = rows.size(0);
  auto write = [&](auto* o) {
    if (kind == BaseQuant::nf4)
      dequantize_nf4_rows_cpu<Public>(data, R, in, o);
    else
      dequantize_8bit_rows_cpu<Public>(data, R, in, kind, o);
  };
  switch (out.scalar_type()) {
    case at::kFloat: write(out.data_ptr<float>()); return true;
    case at::kBFloat16: write(out.data_ptr<at::BFloat16>()); return true;
    default: return false;
  }
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
  if (rows.device().is_cpu() && (public_dtype == at::kFloat || public_dtype == at::kBFloat16)) {
    const at::Tensor contiguous = rows.contiguous();
    at::Tensor out = at::empty({R, in}, rows.options().dtype(dtype));
    const bool done = public_dtype == at::kFloat ? dequantize_rows_cpu_to<float>(contiguous, kind, in, out)
                                                 : dequantize_rows_cpu_to<at::BFloat16>(contiguous, kind, in, out);
    if (done) return out;
  }
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
    if (kind == BaseQuant::int8) values = values * kInt8Step;
  }
  return values.reshape({R, in}).to(public_dtype).to(dtype);
}

}  // namespace mmtrain::quant
