// MagiHuman's activation estimate for `mmtrain plan` (models/activation_estimate.h): the bytes
// one micro-batch keeps for backward, from the forward pass in model.cpp.
//
// Per layer, for L packed tokens (D hidden, hd head_dim, Hq/Hkv heads, U up_gate rows per
// expert, I MLP width), the tensors autograd saves when block GEMMs run in bf16 and the residual
// stream, norms, RoPE and activations in fp32 (model.cpp), assuming fused RMSNorm (input + rstd),
// a flash-style attention kernel (q, k, v, out, logsumexp; no L×L matrix, kv heads not
// expanded) and a SwiGLU7/GELU7 that saves its fp32 input only (the sections are model.cpp's):
//   attention.pre_norm   input h            fp32 [L,D]        4LD   (+ rstd 4L)
//   linear_qkv           input              bf16 [L,D]        2LD
//   q_norm / k_norm      inputs             fp32 [L,Hq·hd], [L,Hkv·hd]  4L(Hq+Hkv)hd (+ rstd)
//   attention kernel     q, k, v (roped)    bf16              2L(Hq+2Hkv)hd
//                        out, logsumexp     bf16 / fp32       2L·Hq·hd + 4L·Hq
//   gate                 sigmoid(g)         fp32 [L,Hq]       4L·Hq
//   linear_proj          input              bf16 [L,Hq·hd]    2L·Hq·hd
//   mlp.pre_norm         input h'           fp32 [L,D]        4LD   (+ rstd 4L)
//   up_gate_proj         input              bf16 [L,D]        2LD
//   activation           input u            fp32 [L,U]        4LU
//   down_proj            input z            bf16 [L,I]        2LI
// Full model, L = 4606: 257,872 B/token in a SwiGLU7 layer (1.19 GB), 244,232 in a GELU7 one.
// Recompute keeps each layer's input h (fp32 [L,D], 4LD) and rebuilds one layer at a time.
// Outside the layers: the batch (x [L,io] fp32, target [L,out] fp32, coords, masks), adapter
// inputs (≤ 4L·io), RoPE [L,6·bands] fp32, the final norm input + normalized rows (8LD) and
// the output and squared error (2 × 4L·out). Backward working set of one layer: the residual
// grad in and out (2 × 4LD) and the grad of the activation input (fp32 4LU) with its bf16 form
// (2LU).
#pragma once
#include "models/magihuman/config.h"
#include "models/activation_estimate.h"

namespace mmtrain::magihuman {

// tokens = packed tokens of one micro-batch (micro_batch_size × seqlen); param_bytes = the size of
// the gathered params' dtype, which the block GEMM inputs and attention tensors take (2 for bf16,
// the figures above; 4 in an fp32 run).
ActivationEstimate magihuman_activation_estimate(const MagiHumanConfig& config, int64_t tokens,
                                                 int64_t param_bytes = 2);

}  // namespace mmtrain::magihuman
