#pragma once
/// @file
/// Causal multi-head self-attention on packed q, k, v rows, as a GPT block computes it:
///
///   qkv  f32 [batch * ctx, 3 * heads * d]: per row, q of every head, then k, then v (head h at
///        columns h*d .. h*d+d-1 of each third, as nanoGPT splits c_attn's output)
///   out  f32 [batch * ctx, heads * d]:    out_h = softmax(q_h k_h^T / sqrt(d) + causal mask) v_h
///   lse  f32 [batch * heads * ctx]:       each row's log-sum-exp of its scaled scores
///
/// Rows are grouped by ctx: rows b*ctx .. b*ctx+ctx-1 are one sequence, row b*ctx+t attends to
/// rows b*ctx .. b*ctx+t.
///
/// The fast path is tiled in the manner of FlashAttention (Dao et al., 2022): a block of query
/// rows meets one block of keys at a time with an online softmax (running maximum and sum), so at
/// most tile x tile scores exist at once, never ctx x ctx; the backward recomputes the scores of
/// each block from q, k and the kept log-sum-exp. The reference computes the whole score matrix
/// in double, softmax by definition. Tolerance between them: 1e-5 + 1e-4 * |ref| (float sums in
/// another order).

#include <cstdint>

#include "troupe/core/tensor.hpp"

namespace troupe::kernels {

/// Checks the shapes (qkv f32 [n, 3*heads*d], n a multiple of ctx, d >= 1) and returns d; throws
/// std::invalid_argument naming what is wrong.
std::int64_t attention_head_dim(const tensor& qkv, std::int64_t ctx, std::int64_t heads);

/// The tiled forward: writes `out` and `lse` (allocated when their shapes differ). `tile` is the
/// block of query rows and of keys (at least 1).
void causal_attention_forward(const tensor& qkv, std::int64_t ctx, std::int64_t heads, tensor& out, tensor& lse,
                              std::int64_t tile = 32);

/// The tiled backward: d loss / d qkv from d loss / d out, given what the forward wrote.
void causal_attention_backward(const tensor& dout, const tensor& qkv, const tensor& out, const tensor& lse,
                               std::int64_t ctx, std::int64_t heads, tensor& dqkv, std::int64_t tile = 32);

/// The definition: whole score matrices, softmax in double. Writes `out` and `lse`.
void causal_attention_forward_reference(const tensor& qkv, std::int64_t ctx, std::int64_t heads, tensor& out,
                                        tensor& lse);

/// The definition's gradient: d loss / d qkv from d loss / d out (recomputes the forward).
void causal_attention_backward_reference(const tensor& dout, const tensor& qkv, std::int64_t ctx, std::int64_t heads,
                                         tensor& dqkv);

}  // namespace troupe::kernels
