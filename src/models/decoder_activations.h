// What autograd saves for one micro-batch of a dense decoder built from nn/ops.cpp's composite
// ops: RMSNorm, grouped-query attention, a SwiGLU MLP, a final norm and an LM head with cross
// entropy. The test transformer and Mistral3's text model are such decoders; each spec fills a
// DecoderShape. For T = micro x seqlen tokens and e the bytes of the compute dtype:
//   rms_norm       input, normalized (e), output read by the next linears (e): 3 T H e (+ 4 T rstd)
//   attention      q, k, v after RoPE, out (e) and logsumexp (fp32): T (2 nh + 2 nkv) hd e + 4 T nh
//   o_proj         its input: T nh hd e
//   SwiGLU MLP     gate x, silu(gate x), up x, their product: 4 T F e
// Recompute keeps each layer's input (T H e). Outside the layers: the final norm (3 T H e), and
// the logits (T V e) with the loss's fp32 copy and log-softmax (2 T V 4), or with a chunked loss
// (loss_chunk tokens at a time) that for one chunk only. Backward: the residual grads in and out
// (2 T H e) and two MLP-wide grads (2 T F e). An estimate: allocator rounding is left out.
#pragma once
#include "models/activation_estimate.h"

#include <cstdint>

namespace mmtrain {

struct DecoderShape {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, layers = 0, vocab = 0;
  int64_t loss_chunk = 0;  // tokens per loss chunk; 0 = the whole logits
};

ActivationEstimate decoder_activation_estimate(const DecoderShape& d, int64_t seqlen, int64_t micro_batch_size,
                                               at::ScalarType dtype);

}  // namespace mmtrain
