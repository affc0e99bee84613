#include "nn/attention_amx.h"

#include "core/error.h"
#ifdef MMTRAIN_NATIVE_KERNELS
#include "nn/attention_rows_avx512.h"
#endif

#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

namespace mmtrain {
namespace {

#ifdef MMTRAIN_NATIVE_KERNELS
namespace cpublas = at::native::cpublas;
using Bf16 = at::BFloat16;

constexpr int64_t kPackCols = 64;     // oneDNN packs B in blocks of 16, 32, 48 or 64 columns
constexpr int64_t kQueryBlock = 64;   // query rows per tile (one packed block)
constexpr int64_t kKeyChunk = 512;    // key rows per chunk: its dk, dv tiles stay in L2 (256: 8 % slower, 1024: 10 %)

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// A GEMM's B operand b [K, N] (any strides, N a multiple of kPackCols) in oneDNN's VNNI layout:
// N / kPackCols blocks of [round_up(K, 2), kPackCols] (an odd K gets a zero row).
at::Tensor pack_b(const at::Tensor& b) {
  const int64_t K = b.size(0), even_k = round_up(K, 2), N = b.size(1);
  auto packed = at::empty({N / kPackCols, even_k, kPackCols}, b.options().dtype(at::kBFloat16));
  auto block = at::zeros({even_k, kPackCols}, packed.options());
  for (int64_t nb = 0; nb < N / kPackCols; ++nb) {
    block.narrow(0, 0, K).copy_(b.narrow(1, nb * kPackCols, kPackCols));
    cpublas::pack(even_k, kPackCols, kPackCols, kPackCols, at::kBFloat16, at::kBFloat16, block.const_data_ptr(),
                  packed[nb].data_ptr());
  }
  return packed;
}

// c [M, N] (row stride ldc) = a [M, K] (row stride lda) · B, or += with accumulate; B as
// pack_b leaves it (K even).
void gemm_packed(int64_t M, int64_t N, int64_t K, const Bf16* a, int64_t lda, const Bf16* b, float* c, int64_t ldc,
                 bool accumulate) {
  for (int64_t nb = 0; nb < N / kPackCols; ++nb)
    cpublas::brgemm(M, kPackCols, K, lda, kPackCols, ldc, accumulate, a, b + nb * K * kPackCols, c + nb * kPackCols,
                    /*is_vnni=*/true);
}
void gemm_packed(int64_t M, int64_t N, int64_t K, const Bf16* a, int64_t lda, const at::Tensor& b, float* c,
                 int64_t ldc, bool accumulate) {
  gemm_packed(M, N, K, a, lda, b.const_data_ptr<Bf16>(), c, ldc, accumulate);
}

// Rows with unit stride along d (the GEMMs read rows through a row stride).
at::Tensor unit_stride(const at::Tensor& t) { return t.stride(2) == 1 ? t : t.contiguous(); }

#endif  // MMTRAIN_NATIVE_KERNELS

bool choice_from_environment() {
  const char* choice = std::getenv("MMTRAIN_CPU_ATTENTION");
  if (choice == nullptr || std::strcmp(choice, "") == 0 || std::strcmp(choice, "auto") == 0) return true;
  if (std::strcmp(choice, "aten") == 0) return false;
  fail("MMTRAIN_CPU_ATTENTION must be auto or aten, got '", choice, "'");
}

}  // namespace

bool amx_attention_enabled() {
  static const bool enabled = choice_from_environment();
  return enabled;
}

#ifdef MMTRAIN_NATIVE_KERNELS

bool amx_attention_backward_usable(const at::Tensor& q, bool causal) {
  static const bool machine = amx_attention_enabled() && cpublas::could_pack(at::kBFloat16) &&
                              attention_rows::avx512_available();
  return machine && q.is_cpu() && q.scalar_type() == at::kBFloat16 && !causal && q.size(2) % kPackCols == 0;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> amx_attention_backward(const at::Tensor& grad_out_in,
                                                                      const at::Tensor& q_in, const at::Tensor& k_in,
                                                                      const at::Tensor& v_in, const at::Tensor& out,
                                                                      const at::Tensor& lse_in, double scale_d) {
  const auto q = unit_stride(q_in), k = unit_stride(k_in), v = unit_stride(v_in), grad_out = unit_stride(grad_out_in);
  const int64_t ql = q.size(0), hq = q.size(1), d = q.size(2), kl = k.size(0), hkv = k.size(1), group = hq / hkv;
  const int64_t blocks = (ql + kQueryBlock - 1) / kQueryBlock, queries_padded = blocks * kQueryBlock;
  const float scale = static_cast<float>(scale_d);
  const auto f32 = q.options().dtype(at::kFloat);

  // Per query column: D = rowsum(do · out) (0 past ql) and lse (+inf past ql, so p = 0 there).
  auto delta = at::zeros({hq, queries_padded}, f32);
  delta.narrow(1, 0, ql).copy_((grad_out.to(at::kFloat) * out.to(at::kFloat)).sum(-1).t());
  auto lse = at::full({hq, queries_padded}, std::numeric_limits<float>::infinity(), f32);
  lse.narrow(1, 0, ql).copy_(lse_in);

  // The query side's operands, packed once: per head and query block, qᵀ and doᵀ [d, 64] for the
  // transposed score tiles; per key/value head and query block, the group's q and do stacked
  // [G * 64, d] for dk and dv (one GEMM over the whole group). Rows past ql are zero.
  auto padded = [&](const at::Tensor& t) {
    auto p = at::zeros({queries_padded, hq, d}, q.options());
    p.narrow(0, 0, ql).copy_(t);
    return p;
  };
  const auto q_pad = padded(q), do_pad = padded(grad_out);
  std::vector<at::Tensor> q_t_packed, do_t_packed;          // [head * blocks + block]
  std::vector<at::Tensor> q_group_packed, do_group_packed;  // [h * blocks + block]
  for (int64_t head = 0; head < hq; ++head)
    for (int64_t b = 0; b < blocks; ++b) {
      q_t_packed.push_back(pack_b(q_pad.narrow(0, b * kQueryBlock, kQueryBlock).select(1, head).t()));
      do_t_packed.push_back(pack_b(do_pad.narrow(0, b * kQueryBlock, kQueryBlock).select(1, head).t()));
    }
  for (int64_t h = 0; h < hkv; ++h)
    for (int64_t b = 0; b < blocks; ++b) {
      auto stacked = [&](const at::Tensor& pad) {  // [64, G, d] -> [G * 64, d], head-major like the tiles
        return pad.narrow(0, b * kQueryBlock, kQueryBlock).narrow(1, h * group, group).transpose(0, 1)
            .reshape({group * kQueryBlock, d});
      };
      q_group_packed.push_back(pack_b(stacked(q_pad)));
      do_group_packed.push_back(pack_b(stacked(do_pad)));
    }

  const int64_t group_cols = group * kQueryBlock;
  auto dq_t = at::zeros({hq, blocks, d, kQueryBlock}, f32);  // dqᵀ per head and query block
  auto dk = at::empty({kl, hkv, d}, q.options()), dv = at::empty({kl, hkv, d}, q.options());
  auto s_t = at::empty({kKeyChunk, kQueryBlock}, f32), dp_t = at::empty({kKeyChunk, kQueryBlock}, f32);
  // pᵀ and dsᵀ of the group's heads side by side [keys, G * 64]; one head's dsᵀ alone for its dq.
  auto p_t = at::empty({kKeyChunk, group_cols}, q.options()), ds_t = at::empty({kKeyChunk, group_cols}, q.options());
  auto ds_head = at::empty({kKeyChunk, kQueryBlock}, q.options()), ds_packed = at::empty_like(ds_head);
  auto dk_acc = at::empty({kKeyChunk, d}, f32), dv_acc = at::empty({kKeyChunk, d}, f32);
  for (int64_t h = 0; h < hkv; ++h) {
    const Bf16* k_rows = k.const_data_ptr<Bf16>() + h * k.stride(1);
    const Bf16* v_rows = v.const_data_ptr<Bf16>() + h * v.stride(1);
    // kᵀ for dqᵀ = kᵀ·dsᵀ, zero past kl (an odd last chunk reads one zero column); rows of a multiple
    // of 64 keys (measured: dq's GEMMs ~15 % faster than with rows of kl rounded to even).
    const int64_t keys_padded = round_up(kl, kPackCols);
    auto kt = at::zeros({d, keys_padded}, q.options());
    kt.narrow(1, 0, kl).copy_(k.select(1, h).t());
    for (int64_t c0 = 0; c0 < kl; c0 += kKeyChunk) {
      const int64_t rows = std::min(kKeyChunk, kl - c0), rows_even = round_up(rows, 2);
      dk_acc.zero_();
      dv_acc.zero_();
      for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t head = h * group + g, slot = head * blocks + b;
          gemm_packed(rows, kQueryBlock, d, k_rows + c0 * k.stride(0), k.stride(0), q_t_packed[slot],
                      s_t.data_ptr<float>(), kQueryBlock, false);
          gemm_packed(rows, kQueryBlock, d, v_rows + c0 * v.stride(0), v.stride(0), do_t_packed[slot],
                      dp_t.data_ptr<float>(), kQueryBlock, false);
          const int64_t column = head * queries_padded + b * kQueryBlock;
          attention_rows::probs_and_grads_t(s_t.data_ptr<float>(), dp_t.data_ptr<float>(), rows, kQueryBlock, scale,
                                            lse.data_ptr<float>() + column, delta.data_ptr<float>() + column,
                                            bits(p_t) + g * kQueryBlock, bits(ds_t) + g * kQueryBlock, group_cols);
          // dqᵀ of this head += kᵀ·dsᵀ (oneDNN packs from a contiguous [keys, 64] block only).
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(bits(ds_head) + r * kQueryBlock, bits(ds_t) + r * group_cols + g * kQueryBlock,
                        kQueryBlock * sizeof(uint16_t));
          if (rows_even != rows) std::memset(bits(ds_head) + rows * kQueryBlock, 0, kQueryBlock * sizeof(uint16_t));
          cpublas::pack(rows_even, kQueryBlock, kQueryBlock, kQueryBlock, at::kBFloat16, at::kBFloat16,
                        ds_head.const_data_ptr(), ds_packed.data_ptr());
          gemm_packed(d, kQueryBlock, rows_even, kt.const_data_ptr<Bf16>() + c0, keys_padded,
                      ds_packed.const_data_ptr<Bf16>(), dq_t.data_ptr<float>() + slot * d * kQueryBlock,
                      kQueryBlock, true);
        }
        gemm_packed(rows, d, group_cols, p_t.const_data_ptr<Bf16>(), group_cols, do_group_packed[h * blocks + b],
                    dv_acc.data_ptr<float>(), d, true);
        gemm_packed(rows, d, group_cols, ds_t.const_data_ptr<Bf16>(), group_cols, q_group_packed[h * blocks + b],
                    dk_acc.data_ptr<float>(), d, true);
      }
      dk.narrow(0, c0, rows).select(1, h).copy_(dk_acc.narrow(0, 0, rows) * scale);
      dv.narrow(0, c0, rows).select(1, h).copy_(dv_acc.narrow(0, 0, rows));
    }
  }
  cpublas::brgemm_release();
  // [hq, blocks, d, 64] -> [blocks, 64, hq, d] -> [ql, hq, d]
  auto dq = (dq_t * scale).permute({1, 3, 0, 2}).reshape({queries_padded, hq, d}).narrow(0, 0, ql).to(at::kBFloat16);
  return {dq, dk, dv};
}

#else  // a build without the native kernels (not x86-64, or MMTRAIN_NATIVE_KERNELS=OFF): ATen's backward always

bool amx_attention_backward_usable(const at::Tensor&, bool) {
  amx_attention_enabled();  // a misspelt MMTRAIN_CPU_ATTENTION is still an error
  return false;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> amx_attention_backward(const at::Tensor&, const at::Tensor&,
                                                                      const at::Tensor&, const at::Tensor&,
                                                                      const at::Tensor&, const at::Tensor&, double) {
  fail("amx_attention_backward: this build has no native CPU kernels (MMTRAIN_NATIVE_KERNELS off or not x86-64); "
       "amx_attention_backward_usable() says so");
}

#endif  // MMTRAIN_NATIVE_KERNELS

}  // namespace mmtrain
