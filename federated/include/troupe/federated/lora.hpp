#pragma once
/// @file
/// Federated LoRA: the server's aggregation rules for low-rank adapters, one linear layer at a
/// time (what `troupe fedsim --lora R --lora-agg fedit|fedex|flexlora|hetlora` runs; the
/// clients' training is a local_trainer in src/lora.cpp).
///
/// troupe's linear layer computes y = x W^T + b with W [out, in]; an adapter changes it to
/// W = W0 + s B A with A [rank, in] (random Gaussian at the start, as in Hu et al., 2021),
/// B [out, rank] (zero at the start) and s = alpha / rank. Here an `adapter` holds the scale
/// folded into B (b = s B), so that adapters of different ranks add up: the layer's change is
/// b a. Matrices are row-major.
///
///   fedit     mean of A, mean of B (Zhang et al., 2024, "Towards building the FederatedGPT");
///             one rank for every client
///   fedex     FedEx-LoRA (Singhal et al., 2025): mean of A, mean of B, and the residual
///             mean(B_k A_k) - mean(B) mean(A) folded into the frozen W0, so that the model is
///             exactly W0 + mean(B_k A_k)
///   flexlora  FlexLoRA (Bai et al., 2024): dW = sum_k w_k B_k A_k, and to each client the
///             truncated SVD of dW at its own rank, the singular values split evenly:
///             B = U_r S_r^1/2, A = S_r^1/2 V_r^T (the split leaves B A, the aggregate and
///             the truncation error as they are; it sets the clients' next steps: with all
///             of S_r on B, rank 2 diverged in docs/federated/models.md's run)
///   hetlora   HetLoRA (Cho et al., 2024): each client's adapter zero-padded to the largest
///             rank, weighted by its norm ||B_k A_k||_F / sum_j ||B_j A_j||_F (the paper's
///             sparsity-weighted aggregation), each client getting the first r_k ranks back
///
/// Weights w_k are the clients' example counts, normalized to sum 1 (FedAvg's; the plain mean
/// when they sum to zero), except HetLoRA's. Sums run in double.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "troupe/core/tensor.hpp"

namespace troupe::federated::lora {

/// A linear layer's weight shape: W [out, in].
struct layer_shape {
  std::int64_t out = 0, in = 0;
};

/// One layer's low-rank change b a, the scale folded into b.
struct adapter {
  std::int64_t rank = 0;
  std::vector<float> a;  ///< rank x in
  std::vector<float> b;  ///< out x rank
};

/// The aggregation rules.
enum class rule { fedit, fedex, flexlora, hetlora };
/// "fedit", "fedex", "flexlora", "hetlora"; throws std::invalid_argument otherwise.
rule parse_rule(const std::string& name);
const char* name_of(rule r) noexcept;

/// "4" or "2,4,8": the clients' ranks (client c gets ranks[c % size]). Throws
/// std::invalid_argument, naming the part, for anything but positive integers up to 4096.
std::vector<std::int64_t> parse_ranks(const std::string& spec);

/// b a: out x in, in double. Throws std::invalid_argument when the sizes do not fit the shape.
std::vector<double> product(const adapter& x, layer_shape shape);

/// FedIT: the weighted means of a and of b. Throws std::invalid_argument for no adapters,
/// different ranks, weights that are negative or not finite, or sizes that do not fit the
/// shape.
adapter mean(std::span<const adapter> clients, std::span<const double> weights, layer_shape shape);

struct fedex_result {
  adapter mean;                  ///< as fedit's
  std::vector<double> residual;  ///< out x in: sum_k w_k b_k a_k - mean.b mean.a
};
/// FedEx-LoRA; throws as mean() does.
fedex_result fedex(std::span<const adapter> clients, std::span<const double> weights, layer_shape shape);

/// FlexLoRA's full-size change sum_k w_k b_k a_k (out x in, weights normalized); any ranks.
std::vector<double> weighted_product_sum(std::span<const adapter> clients, std::span<const double> weights,
                                         layer_shape shape);

struct truncation {
  adapter factors;                       ///< b = U_r S_r^1/2, a = S_r^1/2 V_r^T
  double dropped = 0;                    ///< the sum of the dropped squared singular values
  std::vector<double> singular_values;   ///< all of them, descending
};
/// The best rank-`rank` approximation of `delta` (out x in) by its SVD (kernels::svd), the
/// singular values split evenly between b and a. A rank above min(out, in) keeps them all and pads with zeros. Throws
/// std::invalid_argument for a rank below 1 or a delta of another size.
truncation truncate(std::span<const double> delta, layer_shape shape, std::int64_t rank);

/// The first `rank` ranks of `x` (a's first rows, b's first columns); a rank above x's pads with
/// zeros.
adapter resize(const adapter& x, std::int64_t rank, layer_shape shape);

/// HetLoRA: every adapter zero-padded to `max_rank`, weighted by ||b_k a_k||_F over their sum
/// (the plain mean when every norm is zero). `norm_weights`, when not null, receives the
/// weights. Throws std::invalid_argument for no adapters, one above max_rank, or sizes that do
/// not fit the shape.
adapter hetlora(std::span<const adapter> clients, std::int64_t max_rank, layer_shape shape,
                std::vector<double>* norm_weights = nullptr);

/// The adapters' gradients from the layer's full weight gradient dW [out, in] (the chain rule
/// through W = W0 + s B A): da = s B^T dW [rank, in], db = s dW A^T [out, rank], through
/// kernels::gemm. a [rank, in], b [out, rank] (B unscaled), da and db allocated by the caller.
void adapter_gradients(const tensor& dw, const tensor& a, const tensor& b, float s, tensor& da, tensor& db);
/// The same with plain loops in double (the reference the tests compare with).
void adapter_gradients_reference(const tensor& dw, const tensor& a, const tensor& b, float s, tensor& da, tensor& db);

}  // namespace troupe::federated::lora
