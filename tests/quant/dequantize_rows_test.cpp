// The CPU dequantize loops (quant/dequantize_rows_cpu.h) against a naive loop that computes each
// value's fp32 product and rounds it with c10's conversions, bit for bit: every loop this build
// and CPU have (the table loop always; AVX2 and AVX-512 where built and supported), every format,
// public dtype and output dtype, widths with and without a vector tail, random codes (fp8's two
// NaN codes among them) and scales. And the ATen path (what CUDA runs) against the loops.
#include "core/error.h"
#include "quant/dequantize_rows_cpu.h"
#include "quant/nf4.h"
#include "quant/quantized_rows.h"
#include "quant/rowwise.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/bit_cast.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <cstring>
#include <vector>

namespace mmtrain::quant {
namespace {

// Random rows [R >= 2, row_bytes]: random code bytes, finite positive scales between 2^-8 and 2^8,
// except rows 0 and 1, whose scales make bf16 ties of every power-of-two value (fp8 codes with no
// mantissa, nf4's levels -1, 0 and 1): 1 + 2^-8 rounds down to even, 1 + 2^-7 + 2^-8 up. An
// 8-bit row of 256 or more codes has every code once in row 2 (fp8: subnormals, both NaNs).
at::Tensor random_rows(BaseQuant kind, int64_t R, int64_t in, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t row_bytes = quantized_row_bytes(kind, in);
  at::Tensor rows = at::randint(0, 256, {R, row_bytes}, gen, at::kLong).to(at::kByte);
  const int64_t code_bytes = kind == BaseQuant::nf4 ? in / 2 : in, scales = (row_bytes - code_bytes) / 4;
  at::Tensor scale = at::exp2(at::rand({R, scales}, gen) * 16 - 8).contiguous();
  scale[0].fill_(1.0 + 1.0 / 256);
  scale[1].fill_(1.0 + 1.0 / 128 + 1.0 / 256);
  if (kind != BaseQuant::nf4 && in >= 256 && R > 2) rows[2].narrow(0, 0, 256).copy_(at::arange(256).to(at::kByte));
  rows.narrow(1, code_bytes, 4 * scales).copy_(scale.view(at::kByte));
  return rows;
}

// The fp32 product of element (r, i), one scalar at a time.
float naive_product(const uint8_t* rows, BaseQuant kind, int64_t in, int64_t r, int64_t i) {
  const uint8_t* row = rows + r * quantized_row_bytes(kind, in);
  float scale;
  if (kind == BaseQuant::nf4) {
    std::memcpy(&scale, row + in / 2 + 4 * (i / kNf4Blocksize), 4);
    const uint8_t byte = row[i / 2];
    return nf4_levels()[i % 2 == 0 ? byte >> 4 : byte & 15] * scale;
  }
  std::memcpy(&scale, row + in, 4);
  if (kind == BaseQuant::int8) return static_cast<float>(static_cast<int8_t>(row[i])) * scale * kInt8Step;
  return static_cast<float>(c10::bit_cast<c10::Float8_e4m3fn>(row[i])) * scale;
}

// The naive loop's output, as `out_dtype` rounded through `public_dtype`.
at::Tensor naive(const at::Tensor& rows, BaseQuant kind, int64_t in, at::ScalarType public_dtype,
                 at::ScalarType out_dtype) {
  const int64_t R = rows.size(0);
  std::vector<float> value(R * in);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < in; ++i) {
      const float p = naive_product(rows.const_data_ptr<uint8_t>(), kind, in, r, i);
      value[r * in + i] = public_dtype == at::kBFloat16 ? static_cast<float>(c10::BFloat16(p)) : p;
    }
  return at::from_blob(value.data(), {R, in}, at::kFloat).clone().to(out_dtype);
}

// Bitwise, as integers of their width; a NaN only has to be a NaN (c10's scalar conversion to
// bf16 writes 0x7FC0 for every NaN, ATen's vectorized one keeps the sign).
void expect_same_bits(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const auto as_int = got.element_size() == 4 ? at::kInt : at::kShort;
  const at::Tensor differ = got.view(as_int).ne(want.view(as_int)).logical_and(got.isnan().logical_and(want.isnan()).logical_not());
  const int64_t count = differ.sum().item<int64_t>();
  if (count > 0) {
    const int64_t at = differ.reshape({-1}).nonzero()[0].item<int64_t>();
    ADD_FAILURE() << what << ": " << count << " values differ, first at flat index " << at << ": got "
                  << got.reshape({-1})[at].item<float>() << ", want " << want.reshape({-1})[at].item<float>();
  }
}

struct Case {
  BaseQuant kind;
  int64_t in;
};

const std::vector<Case> kCases = {
    {BaseQuant::nf4, 64},       {BaseQuant::nf4, 320},      {BaseQuant::int8, 5},  {BaseQuant::int8, 16},
    {BaseQuant::int8, 61},      {BaseQuant::int8, 200},     {BaseQuant::fp8_e4m3, 7}, {BaseQuant::fp8_e4m3, 32},
    {BaseQuant::fp8_e4m3, 109}, {BaseQuant::fp8_e4m3, 256},
};

TEST(DequantizeRowsCpu, EveryLoopIsTheNaiveLoopBitwise) {
  int loops = 0;
  for (CpuDequantizer loop : {CpuDequantizer::table, CpuDequantizer::avx2, CpuDequantizer::avx512}) {
    if (!cpu_dequantizer_available(loop)) {
      std::printf("the %s loop is not in this build or on this CPU: not checked\n", cpu_dequantizer_name(loop));
      continue;
    }
    ++loops;
    uint64_t seed = 1;
    for (const Case& c : kCases)
      for (at::ScalarType public_dtype : {at::kFloat, at::kBFloat16})
        for (at::ScalarType out_dtype : {at::kFloat, at::kBFloat16}) {
          const int64_t R = 7;
          const at::Tensor rows = random_rows(c.kind, R, c.in, seed++);
          at::Tensor out = at::empty({R, c.in}, at::TensorOptions().dtype(out_dtype));
          dequantize_rows_cpu(rows, c.kind, c.in, public_dtype, out, loop);
          expect_same_bits(out, naive(rows, c.kind, c.in, public_dtype, out_dtype),
                           std::string(cpu_dequantizer_name(loop)) + " " + base_quant_name(c.kind) + " in " +
                               std::to_string(c.in) + " public " + c10::toString(public_dtype) + " out " +
                               c10::toString(out_dtype));
        }
  }
  std::printf("%d loops checked; dequantize_rows takes %s\n", loops, cpu_dequantizer_name(fastest_cpu_dequantizer()));
}

TEST(DequantizeRowsCpu, TheAtenPathGivesTheLoopsValues) {
  // An fp16 output is not a loop's: dequantize_rows takes the ATen ops that CUDA runs.
  uint64_t seed = 100;
  for (const Case& c : kCases)
    for (at::ScalarType public_dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor rows = random_rows(c.kind, 3, c.in, seed++);  // rows 0, 1: ties
      const at::Tensor aten = dequantize_rows(rows, c.kind, c.in, public_dtype, at::kHalf);
      const at::Tensor loop = dequantize_rows(rows, c.kind, c.in, public_dtype, public_dtype);
      expect_same_bits(aten, loop.to(at::kHalf),
                       std::string("aten ") + base_quant_name(c.kind) + " in " + std::to_string(c.in));
    }
}

TEST(DequantizeRowsCpu, RowsOfAnotherWidthAreRefused) {
  const at::Tensor rows = random_rows(BaseQuant::int8, 2, 16, 7);
  at::Tensor out = at::empty({2, 15}, at::kFloat);
  EXPECT_THROW(dequantize_rows_cpu(rows, BaseQuant::int8, 15, at::kFloat, out, CpuDequantizer::table), Error);
}

// The loops' speed at a real width (a 5120 x 5120 weight, bf16 out, public bf16), A/B interleaved,
// best of 7, beside ATen's ops (the CUDA path, here to fp16) and a copy of the output's bytes:
//   mmtrain_tests --gtest_also_run_disabled_tests --gtest_filter='DequantizeRowsCpu.DISABLED_Timing'
// (OMP_NUM_THREADS=1 for one core). The last line is JSON: ms per weight, by format and loop.
TEST(DequantizeRowsCpu, DISABLED_Timing) {
  using Clock = std::chrono::steady_clock;
  const int64_t out_features = 5120, in = 5120;
  std::string json = "{";
  for (BaseQuant kind : {BaseQuant::nf4, BaseQuant::int8, BaseQuant::fp8_e4m3}) {
    const at::Tensor rows = random_rows(kind, out_features, in, 3);
    at::Tensor out = at::empty({out_features, in}, at::kBFloat16), copy = at::empty_like(out);
    std::vector<std::pair<std::string, std::function<void()>>> arms = {
        {"copy", [&] { copy.copy_(out); }},
        {"aten", [&] { (void)dequantize_rows(rows, kind, in, at::kBFloat16, at::kHalf); }}};
    for (CpuDequantizer loop : {CpuDequantizer::table, CpuDequantizer::avx2, CpuDequantizer::avx512})
      if (cpu_dequantizer_available(loop))
        arms.emplace_back(cpu_dequantizer_name(loop),
                          [&, loop] { dequantize_rows_cpu(rows, kind, in, at::kBFloat16, out, loop); });
    std::vector<double> best(arms.size(), 1e30);
    for (int rep = 0; rep < 7; ++rep)
      for (size_t a = 0; a < arms.size(); ++a) {
        const auto t0 = Clock::now();
        arms[a].second();
        best[a] = std::min(best[a], std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
    json += std::string(json.size() > 1 ? ", " : "") + "\"" + base_quant_name(kind) + "\": {";
    for (size_t a = 0; a < arms.size(); ++a) {
      std::printf("%-9s %-7s %8.2f ms\n", base_quant_name(kind), arms[a].first.c_str(), best[a]);
      json += (a ? ", \"" : "\"") + arms[a].first + "\": " + std::to_string(best[a]);
    }
    json += "}";
  }
  std::printf("%s, \"threads\": %d}\n", json.c_str(), at::get_num_threads());
}

}  // namespace
}  // namespace mmtrain::quant
