// Fused CPU kernels (contracts in fused_ops.h). Op order follows the reference ops,
// one fp32 operation for one ATen operation, so that the forwards (and for swiglu7/gelu7/rope the
// backwards, whose order follows the autograd formulas of mul, sigmoid, clamp and slice) agree
// bitwise. Where ATen's own kernels fix the bits (the mean's summation order, MKL's rsqrt, the
// vectorised exp inside sigmoid) the kernels call them on small cache-resident blocks of scratch.
// The deliberate exception: RMSNorm's backward is the closed form, not the chain of autograd nodes.
#include "nn/fused_ops.h"

#include "core/error.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace mmtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kLimit = 7.0;   // the "7" of swiglu7/gelu7: the clamp limit
constexpr double kAlpha = 1.702;  // sigmoid(alpha * x): the quick-GELU slope
// Elements per sigmoid call: a multiple of every ATen vector width, so no element of a full block
// takes ATen's scalar tail path, and below at::internal::GRAIN_SIZE, so the call stays serial.
constexpr int64_t kSigmoidBlock = 16384;
// Elements per RMSNorm forward block: a scratch of squares that stays in L2.
constexpr int64_t kNormBlock = 65536;
// Rows per partial sum of the RMSNorm weight gradient: fixed, so the summation order (and the
// result) does not depend on the thread count.
constexpr int64_t kNormRowsPerChunk = 64;

int64_t divup(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Rows per parallel task: about 32K elements, so small tensors stay on one thread.
int64_t row_grain(int64_t row_elems) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_elems)); }

template <typename scalar_t>
constexpr at::ScalarType opmath_dtype() {
  return c10::CppTypeToScalarType<at::opmath_type<scalar_t>>::value;
}

void check_cpu_floating(const at::Tensor& t, const char* op, const char* name) {
  if (!t.defined()) fail(op, ": ", name, " is undefined");
  if (!t.device().is_cpu()) fail(op, ": ", name, " is on ", t.device(), "; the fused kernels are CPU only");
  if (!c10::isFloatingType(t.scalar_type()))
    fail(op, ": ", name, " has dtype ", t.scalar_type(), "; expected a floating dtype");
}

// In-place sigmoid of n contiguous values by ATen's own CPU kernel: the reference op's vectorised
// exp, hence the same bits. The call is serial (n <= kSigmoidBlock, or inside parallel_for).
template <typename acc_t>
void sigmoid_inplace(acc_t* z, int64_t n) {
  at::from_blob(z, {n}, at::TensorOptions().dtype(c10::CppTypeToScalarType<acc_t>::value)).sigmoid_();
}

// ---------------------------------------------------------------------------------------------
// RMSNorm (1 + w)

// Rows of x [N, D] or [N, H, D] with unit stride along D, e.g. q and k, which are [L, H, hd] views
// of the qkv GEMM output [L, qkv]: row r starts at (r / H) * outer + (r % H) * inner elements.
struct RowLayout {
  int64_t heads = 1, outer = 0, inner = 0;
  int64_t offset(int64_t row) const { return (row / heads) * outer + (row % heads) * inner; }
};

// x itself when RowLayout can address its rows, else a contiguous [rows, D] copy.
at::Tensor addressable_rows(const at::Tensor& x, RowLayout& layout) {
  if (x.stride(-1) == 1 && x.dim() == 2) {
    layout = {1, x.stride(0), 0};
    return x;
  }
  if (x.stride(-1) == 1 && x.dim() == 3) {
    layout = {std::max<int64_t>(1, x.size(1)), x.stride(0), x.stride(1)};
    return x;
  }
  const int64_t d = x.size(-1);
  layout = {1, d, 0};
  return x.contiguous();
}

// y = (x * rsqrt(mean(x^2) + eps)) * (1 + w); rstd [rows] keeps the rsqrt for the backward.
// Two passes over x. First, rows in blocks of about kNormBlock elements: their squares into a
// scratch block and ATen's own mean over it (the reference's per-row summation order, which
// does not depend on the rows around it). Then + eps and ATen's rsqrt over all rows at once (MKL's
// vsInvSqrt, not 1 / sqrt) outside any parallel region: MKL called from inside one stalled the
// threads under CPU contention (forwards 10-40x slower). Then the scaling.
template <typename scalar_t>
void rms_norm_forward_kernel(const at::Tensor& x, const RowLayout& layout, const at::Tensor& gamma,
                             double eps, at::Tensor& y, at::Tensor& rstd) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t d = x.size(-1), rows = rstd.numel();
  const int64_t block = std::max<int64_t>(1, kNormBlock / std::max<int64_t>(1, d));
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const acc_t* gp = gamma.const_data_ptr<acc_t>();
  scalar_t* yp = y.mutable_data_ptr<scalar_t>();
  acc_t* rp = rstd.mutable_data_ptr<acc_t>();
  const auto acc_options = at::TensorOptions().dtype(rstd.scalar_type());
  at::parallel_for(0, divup(rows, block), 1, [&](int64_t bb, int64_t be) {
    std::vector<acc_t> squares(static_cast<size_t>(block * d));
    for (int64_t b = bb; b < be; ++b) {
      const int64_t r0 = b * block, n = std::min(rows, r0 + block) - r0;
      for (int64_t r = 0; r < n; ++r) {
        const scalar_t* xr = xp + layout.offset(r0 + r);
        acc_t* sq = squares.data() + r * d;
        for (int64_t i = 0; i < d; ++i) {
          const acc_t v = static_cast<acc_t>(xr[i]);
          sq[i] = v * v;  // pow(2)
        }
      }
      auto mean = at::from_blob(rp + r0, {n}, acc_options);
      at::mean_out(mean, at::from_blob(squares.data(), {n, d}, acc_options), {1});
    }
  });
  rstd.add_(eps).rsqrt_();
  at::parallel_for(0, rows, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = xp + layout.offset(r);
      const acc_t s = rp[r];
      scalar_t* yr = yp + r * d;
      for (int64_t i = 0; i < d; ++i) yr[i] = static_cast<scalar_t>(static_cast<acc_t>(xr[i]) * s * gp[i]);
    }
  });
}

// sum_i gy[i] * gamma[i] * x[i]: 8 independent fp32 lanes (vectorisable without reassociating
// one sum) combined in double.
template <typename scalar_t>
double row_dot(const scalar_t* gy, const at::opmath_type<scalar_t>* gamma, const scalar_t* x, int64_t n) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kLanes = 8;
  acc_t lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k)
      lane[k] += static_cast<acc_t>(gy[i + k]) * gamma[i + k] * static_cast<acc_t>(x[i + k]);
  double sum = 0.0;
  for (; i < n; ++i) sum += static_cast<double>(static_cast<acc_t>(gy[i]) * gamma[i] * static_cast<acc_t>(x[i]));
  for (int k = 0; k < kLanes; ++k) sum += static_cast<double>(lane[k]);
  return sum;
}

// With t = x * rs and gy the output gradient (upcast):
//   dw = sum_rows gy * t
//   dx = rs * (gy * (1 + w)) - rs^3 * x * sum_d(gy * (1 + w) * x) / D
// dw: one fp32 partial per kNormRowsPerChunk rows, combined in chunk order in double.
template <typename scalar_t>
void rms_norm_backward_kernel(const at::Tensor& x, const RowLayout& layout, const at::Tensor& gamma,
                              const at::Tensor& rstd, const at::Tensor& gy, at::Tensor& dx,
                              at::Tensor& dw_acc, bool need_dx, bool need_dw) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t d = x.size(-1), rows = rstd.numel();
  const int64_t chunks = divup(rows, kNormRowsPerChunk);
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const scalar_t* gyp = gy.const_data_ptr<scalar_t>();
  const acc_t* gp = gamma.const_data_ptr<acc_t>();
  const acc_t* rp = rstd.const_data_ptr<acc_t>();
  scalar_t* dxp = need_dx ? dx.mutable_data_ptr<scalar_t>() : nullptr;
  std::vector<acc_t> partial(need_dw ? static_cast<size_t>(chunks * d) : 0, acc_t(0));
  const acc_t d_a = static_cast<acc_t>(d);
  at::parallel_for(0, chunks, std::max<int64_t>(1, row_grain(d) / kNormRowsPerChunk), [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      acc_t* part = need_dw ? partial.data() + c * d : nullptr;
      for (int64_t r = c * kNormRowsPerChunk, re = std::min(rows, r + kNormRowsPerChunk); r < re; ++r) {
        const scalar_t* xr = xp + layout.offset(r);
        const scalar_t* gr = gyp + r * d;
        const acc_t rs = rp[r];
        if (need_dw)
          for (int64_t i = 0; i < d; ++i) part[i] += static_cast<acc_t>(gr[i]) * (static_cast<acc_t>(xr[i]) * rs);
        if (!need_dx) continue;
        const double dot = row_dot(gr, gp, xr, d);
        const double rs_d = static_cast<double>(rs);
        const acc_t coef = static_cast<acc_t>(rs_d * rs_d * rs_d * dot / static_cast<double>(d_a));
        scalar_t* dxr = dxp + r * d;
        for (int64_t i = 0; i < d; ++i) {
          const acc_t xv = static_cast<acc_t>(xr[i]);
          dxr[i] = static_cast<scalar_t>(rs * (static_cast<acc_t>(gr[i]) * gp[i]) - coef * xv);
        }
      }
    }
  });
  if (!need_dw) return;
  double* dwp = dw_acc.mutable_data_ptr<double>();
  at::parallel_for(0, d, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      double sum = 0.0;
      for (int64_t c = 0; c < chunks; ++c) sum += static_cast<double>(partial[c * d + i]);
      dwp[i] = sum;
    }
  });
}

// y = x * rsqrt(mean(x^2) + eps) * (w + weight_offset): offset 1 is MagiHuman's (1 + w), 0 Llama's.
struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  // Saves x and (w + offset) in opmath, not w itself, as the reference graph does: a parameter that
  // FSDP reshards after forward is never held by the graph.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps,
                            double weight_offset) {
    RowLayout layout;
    auto xr = addressable_rows(x, layout);
    auto y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor rstd, gamma;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_rms_norm_1p", [&] {
      const auto acc = opmath_dtype<scalar_t>();
      gamma = weight.to(acc);
      gamma = (weight_offset != 0.0 ? gamma + weight_offset : gamma).contiguous();  // (1 + w): w.float() + 1
      rstd = at::empty({x.numel() / std::max<int64_t>(1, x.size(-1))}, x.options().dtype(acc));
      rms_norm_forward_kernel<scalar_t>(xr, layout, gamma, eps, y, rstd);
    });
    ctx->save_for_backward({x});
    ctx->saved_data["gamma"] = gamma;
    ctx->saved_data["rstd"] = rstd;
    ctx->saved_data["weight_dtype"] = weight.scalar_type();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto x = ctx->get_saved_variables()[0];
    const auto gamma = ctx->saved_data["gamma"].toTensor();
    const auto rstd = ctx->saved_data["rstd"].toTensor();
    const bool need_dx = ctx->needs_input_grad(0), need_dw = ctx->needs_input_grad(1);
    at::Tensor dx, dw;
    if (!grads[0].defined() || (!need_dx && !need_dw)) return {dx, dw, at::Tensor(), at::Tensor()};
    RowLayout layout;
    auto xr = addressable_rows(x, layout);
    auto gy = grads[0].to(x.scalar_type()).contiguous();
    if (need_dx) dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    auto dw_acc = need_dw ? at::empty({x.size(-1)}, x.options().dtype(at::kDouble)) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_rms_norm_1p_backward", [&] {
      rms_norm_backward_kernel<scalar_t>(xr, layout, gamma, rstd, gy, dx, dw_acc, need_dx, need_dw);
    });
    if (need_dw) dw = dw_acc.to(ctx->saved_data["weight_dtype"].toScalarType());
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// swiglu7 / gelu7

// Where the gate and linear values of output element j of a row sit within that row of u.
struct GluLayout {
  int64_t width;      // I, the output width
  bool gated;         // swiglu7 (gate and linear) or gelu7 (gate only)
  bool interleaved;   // gate 2j / linear 2j+1, else gate j / linear I+j
  int64_t in_row() const { return gated ? 2 * width : width; }
  int64_t gate_stride() const { return gated && interleaved ? 2 : 1; }
  int64_t linear_offset() const { return interleaved ? 1 : width; }
};

// The gate stride gs (2: interleaved, else 1) is a template argument so the loops vectorise.
// Runs fn(u_row, out_row_index, j0, n, s) over the flat output elements [0, rows * I) in blocks of
// kSigmoidBlock, where s[0..n) = sigmoid(alpha * min(gate, 7)) for the segment of n elements
// starting at output column j0 of row out_row_index; the segments of a block share one sigmoid call.
template <typename scalar_t, int64_t gs, typename Fn>
void for_each_glu_block(const scalar_t* u, int64_t rows, const GluLayout& g, const Fn& fn) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t total = rows * g.width, blocks = divup(total, kSigmoidBlock);
  const acc_t limit = static_cast<acc_t>(kLimit), alpha = static_cast<acc_t>(kAlpha);
  at::parallel_for(0, blocks, 1, [&](int64_t bb, int64_t be) {
    std::vector<acc_t> s(kSigmoidBlock);
    for (int64_t b = bb; b < be; ++b) {
      const int64_t e0 = b * kSigmoidBlock, e1 = std::min(total, e0 + kSigmoidBlock);
      for (int64_t e = e0; e < e1;) {  // z = alpha * min(gate, 7), row segment by row segment
        const int64_t row = e / g.width, j0 = e % g.width, n = std::min(g.width - j0, e1 - e);
        const scalar_t* gate = u + row * g.in_row() + j0 * gs;
        acc_t* z = s.data() + (e - e0);
        for (int64_t j = 0; j < n; ++j) {
          const acc_t v = static_cast<acc_t>(gate[j * gs]);
          z[j] = alpha * (v > limit ? limit : v);
        }
        e += n;
      }
      sigmoid_inplace(s.data(), e1 - e0);
      for (int64_t e = e0; e < e1;) {
        const int64_t row = e / g.width, j0 = e % g.width, n = std::min(g.width - j0, e1 - e);
        fn(u + row * g.in_row(), row, j0, n, s.data() + (e - e0));
        e += n;
      }
    }
  });
}

// out = a * s * (b + 1), a = min(gate, 7), b = clamp(linear, -7, 7) (gelu7: out = a * s)
template <typename scalar_t, int64_t gs>
void glu_forward_kernel(const at::Tensor& u, const GluLayout& g, at::Tensor& out) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t limit = static_cast<acc_t>(kLimit);
  const int64_t lo = g.linear_offset();
  acc_t* op = out.mutable_data_ptr<acc_t>();
  for_each_glu_block<scalar_t, gs>(u.const_data_ptr<scalar_t>(), out.numel() / std::max<int64_t>(1, g.width), g,
                     [&](const scalar_t* ur, int64_t row, int64_t j0, int64_t n, const acc_t* s) {
    acc_t* o = op + row * g.width + j0;
    const scalar_t* gate = ur + j0 * gs;
    if (!g.gated) {
      for (int64_t j = 0; j < n; ++j) {
        const acc_t v = static_cast<acc_t>(gate[j]);
        o[j] = (v > limit ? limit : v) * s[j];
      }
      return;
    }
    const scalar_t* linear = gate + lo;
    for (int64_t j = 0; j < n; ++j) {
      const acc_t v = static_cast<acc_t>(gate[j * gs]), l = static_cast<acc_t>(linear[j * gs]);
      const acc_t a = v > limit ? limit : v;
      const acc_t b = std::min(std::max(l, -limit), limit);
      o[j] = a * s[j] * (b + acc_t(1));
    }
  });
}

// The reference's autograd, node by node (P = a * s, z = alpha * a):
//   dP = go * (b + 1), db = go * P, da = dP * s + ((dP * a) * (1 - s)) * s * alpha
//   dgate = gate <= 7 ? da : 0 (clamp_max's backward), dlinear = -7 <= linear <= 7 ? db : 0
// gelu7: dP is go itself and there is no linear.
template <typename scalar_t, int64_t gs>
void glu_backward_kernel(const at::Tensor& u, const GluLayout& g, const at::Tensor& go, at::Tensor& du) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t limit = static_cast<acc_t>(kLimit), alpha = static_cast<acc_t>(kAlpha), one(1), zero(0);
  const int64_t lo = g.linear_offset();
  const scalar_t* up = u.const_data_ptr<scalar_t>();
  const acc_t* gop = go.const_data_ptr<acc_t>();
  scalar_t* dup = du.mutable_data_ptr<scalar_t>();
  for_each_glu_block<scalar_t, gs>(up, go.numel() / std::max<int64_t>(1, g.width), g,
                     [&](const scalar_t* ur, int64_t row, int64_t j0, int64_t n, const acc_t* s) {
    const acc_t* gor = gop + row * g.width + j0;
    const scalar_t* gate = ur + j0 * gs;
    scalar_t* dgate = dup + (ur - up) + j0 * gs;
    if (!g.gated) {
      for (int64_t j = 0; j < n; ++j) {
        const acc_t v = static_cast<acc_t>(gate[j]);
        const acc_t a = v > limit ? limit : v;
        const acc_t da = gor[j] * s[j] + ((gor[j] * a) * (one - s[j])) * s[j] * alpha;
        dgate[j] = static_cast<scalar_t>(v <= limit ? da : zero);
      }
      return;
    }
    const scalar_t* linear = gate + lo;
    scalar_t* dlinear = dgate + lo;
    for (int64_t j = 0; j < n; ++j) {
      const acc_t v = static_cast<acc_t>(gate[j * gs]), l = static_cast<acc_t>(linear[j * gs]);
      const acc_t a = v > limit ? limit : v;
      const acc_t b = std::min(std::max(l, -limit), limit);
      const acc_t dp = gor[j] * (b + one);
      const acc_t db = gor[j] * (a * s[j]);
      const acc_t da = dp * s[j] + ((dp * a) * (one - s[j])) * s[j] * alpha;
      dgate[j * gs] = static_cast<scalar_t>(v <= limit ? da : zero);
      dlinear[j * gs] = static_cast<scalar_t>(l >= -limit && l <= limit ? db : zero);
    }
  });
}

GluLayout glu_layout(const at::Tensor& u, bool gated, bool interleaved, const char* op) {
  if (u.dim() < 1) fail(op, ": expected u with at least one dim, got a scalar");
  const int64_t w = u.size(-1);
  if (gated && w % 2 != 0) fail(op, ": the last dim of u is ", w, "; expected an even width [gate | linear]");
  return {gated ? w / 2 : w, gated, interleaved};
}

struct GluFunction : torch::autograd::Function<GluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& u_in, bool gated, bool interleaved) {
    const auto g = glu_layout(u_in, gated, interleaved, gated ? "fused_swiglu7" : "fused_gelu7");
    auto u = u_in.contiguous();
    auto shape = u.sizes().vec();
    shape.back() = g.width;
    at::Tensor out;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, u.scalar_type(), "fused_glu7", [&] {
      out = at::empty(shape, u.options().dtype(opmath_dtype<scalar_t>()));
      if (g.gate_stride() == 2)
        glu_forward_kernel<scalar_t, 2>(u, g, out);
      else
        glu_forward_kernel<scalar_t, 1>(u, g, out);
    });
    ctx->save_for_backward({u});
    ctx->saved_data["gated"] = gated;
    ctx->saved_data["interleaved"] = interleaved;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto u = ctx->get_saved_variables()[0];
    const bool gated = ctx->saved_data["gated"].toBool(), interleaved = ctx->saved_data["interleaved"].toBool();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto g = glu_layout(u, gated, interleaved, gated ? "fused_swiglu7" : "fused_gelu7");
    auto du = at::empty_like(u);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, u.scalar_type(), "fused_glu7_backward", [&] {
      auto go = grads[0].to(opmath_dtype<scalar_t>()).contiguous();
      if (g.gate_stride() == 2)
        glu_backward_kernel<scalar_t, 2>(u, g, go, du);
      else
        glu_backward_kernel<scalar_t, 1>(u, g, go, du);
    });
    return {du, at::Tensor(), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// Partial RoPE

// out[j] = x[j] * cos_j - x[j+h] * sin_j, out[j+h] = x[j+h] * cos_j + x[j] * sin_j (j < h = 3B),
// out[2h..hd) = x[2h..hd); the rope row of token n serves all its heads.
template <typename scalar_t>
void rope_forward_kernel(const at::Tensor& x, const at::Tensor& rope, at::Tensor& out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n_tok = x.size(0), heads = x.size(1), hd = x.size(2), rw = rope.size(1);
  const int64_t half = rw / 2, rotated = 2 * half;
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const acc_t* rp = rope.const_data_ptr<acc_t>();
  acc_t* op = out.mutable_data_ptr<acc_t>();
  at::parallel_for(0, n_tok, row_grain(heads * hd), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const acc_t* sn = rp + n * rw;
      const acc_t* cn = sn + half;
      for (int64_t h = 0; h < heads; ++h) {
        const scalar_t* xr = xp + (n * heads + h) * hd;
        acc_t* o = op + (n * heads + h) * hd;
        for (int64_t j = 0; j < half; ++j) {
          const acc_t x1 = static_cast<acc_t>(xr[j]), x2 = static_cast<acc_t>(xr[j + half]);
          o[j] = x1 * cn[j] - x2 * sn[j];
          o[j + half] = x2 * cn[j] + x1 * sn[j];
        }
        for (int64_t j = rotated; j < hd; ++j) o[j] = static_cast<acc_t>(xr[j]);
      }
    }
  });
}

// The inverse rotation: dx[j] = g[j] * cos + g[j+h] * sin, dx[j+h] = g[j+h] * cos - g[j] * sin;
// drope (when rope needs a gradient): dsin_j = sum_heads(g[j+h] * x[j] - g[j] * x[j+h]),
// dcos_j = sum_heads(g[j] * x[j] + g[j+h] * x[j+h]), summed over heads in order in double.
template <typename scalar_t>
void rope_backward_kernel(const at::Tensor& x, const at::Tensor& rope, const at::Tensor& go,
                          at::Tensor& dx, at::Tensor& drope, bool need_dx, bool need_drope) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n_tok = x.size(0), heads = x.size(1), hd = x.size(2), rw = rope.size(1);
  const int64_t half = rw / 2, rotated = 2 * half;
  const scalar_t* xp = need_drope ? x.const_data_ptr<scalar_t>() : nullptr;
  const acc_t* rp = rope.const_data_ptr<acc_t>();
  const acc_t* gp = go.const_data_ptr<acc_t>();
  scalar_t* dxp = need_dx ? dx.mutable_data_ptr<scalar_t>() : nullptr;
  acc_t* drp = need_drope ? drope.mutable_data_ptr<acc_t>() : nullptr;
  at::parallel_for(0, n_tok, row_grain(heads * hd), [&](int64_t begin, int64_t end) {
    std::vector<double> dsin(need_drope ? half : 0), dcos(need_drope ? half : 0);
    for (int64_t n = begin; n < end; ++n) {
      const acc_t* sn = rp + n * rw;
      const acc_t* cn = sn + half;
      std::fill(dsin.begin(), dsin.end(), 0.0);
      std::fill(dcos.begin(), dcos.end(), 0.0);
      for (int64_t h = 0; h < heads; ++h) {
        const acc_t* g = gp + (n * heads + h) * hd;
        if (need_dx) {
          scalar_t* d = dxp + (n * heads + h) * hd;
          for (int64_t j = 0; j < half; ++j) {
            d[j] = static_cast<scalar_t>(g[j] * cn[j] + g[j + half] * sn[j]);
            d[j + half] = static_cast<scalar_t>(g[j + half] * cn[j] - g[j] * sn[j]);
          }
          for (int64_t j = rotated; j < hd; ++j) d[j] = static_cast<scalar_t>(g[j]);
        }
        if (need_drope) {
          const scalar_t* xr = xp + (n * heads + h) * hd;
          for (int64_t j = 0; j < half; ++j) {
            const acc_t x1 = static_cast<acc_t>(xr[j]), x2 = static_cast<acc_t>(xr[j + half]);
            dsin[j] += static_cast<double>(g[j + half] * x1 - g[j] * x2);
            dcos[j] += static_cast<double>(g[j] * x1 + g[j + half] * x2);
          }
        }
      }
      if (!need_drope) continue;
      acc_t* dr = drp + n * rw;
      for (int64_t j = 0; j < half; ++j) {
        dr[j] = static_cast<acc_t>(dsin[j]);
        dr[j + half] = static_cast<acc_t>(dcos[j]);
      }
      for (int64_t j = rotated; j < rw; ++j) dr[j] = acc_t(0);  // an odd rope width: last column unused
    }
  });
}

void check_rope_shapes(const at::Tensor& x, const at::Tensor& rope) {
  if (x.dim() != 3) fail("fused_partial_rope: x has shape ", x.sizes(), "; expected [N, heads, head_dim]");
  if (rope.dim() != 2 || rope.size(0) != x.size(0) || rope.size(1) / 2 * 2 > x.size(2))
    fail("fused_partial_rope: rope has shape ", rope.sizes(), " for x ", x.sizes(),
         "; expected [N, 6B] with 6B <= head_dim");
}

struct PartialRopeFunction : torch::autograd::Function<PartialRopeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& rope_in) {
    check_rope_shapes(x_in, rope_in);
    auto x = x_in.contiguous();
    at::Tensor out, rope;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_partial_rope", [&] {
      const auto acc = opmath_dtype<scalar_t>();
      rope = rope_in.to(acc).contiguous();
      out = at::empty(x.sizes(), x.options().dtype(acc));
      rope_forward_kernel<scalar_t>(x, rope, out);
    });
    // x only matters for the rope gradient; the model's rope never needs one
    ctx->save_for_backward({rope_in.requires_grad() ? x : at::Tensor(), rope_in});
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& rope_in = saved[1];
    const bool need_dx = ctx->needs_input_grad(0), need_drope = ctx->needs_input_grad(1) && x.defined();
    at::Tensor dx, drope;
    if (!grads[0].defined() || (!need_dx && !need_drope)) return {dx, drope};
    const auto x_dtype = ctx->saved_data["x_dtype"].toScalarType();
    const auto x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x_dtype, "fused_partial_rope_backward", [&] {
      const auto acc = opmath_dtype<scalar_t>();
      auto rope = rope_in.to(acc).contiguous();
      auto go = grads[0].to(acc).contiguous();
      if (need_dx) dx = at::empty(x_sizes, go.options().dtype(x_dtype));
      if (need_drope) drope = at::empty(rope.sizes(), rope.options());
      rope_backward_kernel<scalar_t>(need_drope ? x : go /* unread */, rope, go, dx, drope, need_dx, need_drope);
    });
    if (need_drope) drope = drope.to(rope_in.scalar_type());
    return {dx, drope};
  }
};

// ---------------------------------------------------------------------------------------------
// silu(g) * u (the SwiGLU product of the Llama-family MLP)

// out = g * s * u with s = sigmoid(g), blocks of kSigmoidBlock elements through ATen's sigmoid.
// Backward: du = go * g * s; dg = go * u * s * (1 + g * (1 - s)).
template <typename scalar_t>
void silu_mul_kernel(const scalar_t* g, const scalar_t* u, const scalar_t* go, scalar_t* out, scalar_t* dg,
                     scalar_t* du, int64_t n) {
  using acc_t = at::opmath_type<scalar_t>;
  at::parallel_for(0, divup(n, kSigmoidBlock), 1, [&](int64_t bb, int64_t be) {
    std::vector<acc_t> s(kSigmoidBlock);
    for (int64_t b = bb; b < be; ++b) {
      const int64_t e0 = b * kSigmoidBlock, m = std::min(n, e0 + kSigmoidBlock) - e0;
      for (int64_t i = 0; i < m; ++i) s[i] = static_cast<acc_t>(g[e0 + i]);
      sigmoid_inplace(s.data(), m);
      for (int64_t i = 0; i < m; ++i) {
        const int64_t e = e0 + i;
        const acc_t gv = static_cast<acc_t>(g[e]), uv = static_cast<acc_t>(u[e]), sv = s[i];
        if (!go) {
          out[e] = static_cast<scalar_t>(gv * sv * uv);
          continue;
        }
        const acc_t gov = static_cast<acc_t>(go[e]);
        du[e] = static_cast<scalar_t>(gov * gv * sv);
        dg[e] = static_cast<scalar_t>(gov * uv * sv * (acc_t(1) + gv * (acc_t(1) - sv)));
      }
    }
  });
}

struct SiluMulFunction : torch::autograd::Function<SiluMulFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_in, const at::Tensor& up_in) {
    auto gate = gate_in.contiguous(), up = up_in.to(gate.scalar_type()).contiguous();
    auto out = at::empty(gate.sizes(), gate.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate.scalar_type(), "fused_silu_mul", [&] {
      silu_mul_kernel<scalar_t>(gate.const_data_ptr<scalar_t>(), up.const_data_ptr<scalar_t>(), nullptr,
                                out.mutable_data_ptr<scalar_t>(), nullptr, nullptr, gate.numel());
    });
    ctx->save_for_backward({gate, up});
    ctx->saved_data["up_dtype"] = up_in.scalar_type();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& gate = saved[0];
    const auto& up = saved[1];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    auto go = grads[0].to(gate.scalar_type()).contiguous();
    auto dg = at::empty(gate.sizes(), gate.options()), du = at::empty(gate.sizes(), gate.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate.scalar_type(), "fused_silu_mul_backward", [&] {
      silu_mul_kernel<scalar_t>(gate.const_data_ptr<scalar_t>(), up.const_data_ptr<scalar_t>(),
                                go.const_data_ptr<scalar_t>(), nullptr, dg.mutable_data_ptr<scalar_t>(),
                                du.mutable_data_ptr<scalar_t>(), gate.numel());
    });
    return {dg, du.to(ctx->saved_data["up_dtype"].toScalarType())};
  }
};

// The checks and the call both RMSNorm entry points share; op names the entry point in errors.
at::Tensor rms_norm_checked(const char* op, const at::Tensor& x, const at::Tensor& weight, double eps,
                            double weight_offset) {
  check_cpu_floating(x, op, "x");
  check_cpu_floating(weight, op, "weight");
  if (x.dim() < 1 || weight.dim() != 1 || weight.size(0) != x.size(-1))
    fail(op, ": weight has shape ", weight.sizes(), " for x ", x.sizes(), "; expected [", x.size(-1), "]");
  return RmsNormFunction::apply(x, weight, eps, weight_offset);
}

}  // namespace

at::Tensor fused_rms_norm_1p(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return rms_norm_checked("fused_rms_norm_1p", x, weight, eps, 1.0);
}

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return rms_norm_checked("fused_rms_norm", x, weight, eps, 0.0);
}

at::Tensor fused_swiglu7(const at::Tensor& u, bool interleaved) {
  check_cpu_floating(u, "fused_swiglu7", "u");
  return GluFunction::apply(u, /*gated=*/true, interleaved);
}

at::Tensor fused_gelu7(const at::Tensor& u) {
  check_cpu_floating(u, "fused_gelu7", "u");
  return GluFunction::apply(u, /*gated=*/false, /*interleaved=*/false);
}

at::Tensor fused_partial_rope(const at::Tensor& x, const at::Tensor& rope) {
  check_cpu_floating(x, "fused_partial_rope", "x");
  check_cpu_floating(rope, "fused_partial_rope", "rope");
  return PartialRopeFunction::apply(x, rope);
}

at::Tensor fused_silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_cpu_floating(gate, "fused_silu_mul", "gate");
  check_cpu_floating(up, "fused_silu_mul", "up");
  if (gate.sizes() != up.sizes())
    fail("fused_silu_mul: gate has shape ", gate.sizes(), " but up ", up.sizes(), "; expected the same");
  return SiluMulFunction::apply(gate, up);
}

}  // namespace mmtrain

