// The server's aggregation rules for LoRA adapters (lora.hpp), one layer at a time.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

#include "troupe/federated/lora.hpp"
#include "troupe/kernels/gemm.hpp"
#include "troupe/kernels/svd.hpp"

namespace troupe::federated::lora {

namespace {

void check_fits(const adapter& x, layer_shape shape) {
  if (x.rank < 1 || x.a.size() != static_cast<std::size_t>(x.rank * shape.in) ||
      x.b.size() != static_cast<std::size_t>(shape.out * x.rank))
    throw std::invalid_argument("lora: an adapter of rank " + std::to_string(x.rank) + " with " +
                                std::to_string(x.a.size()) + " + " + std::to_string(x.b.size()) +
                                " values does not fit a " + std::to_string(shape.out) + " x " + std::to_string(shape.in) +
                                " layer");
}

/// The weights divided by their sum.
std::vector<double> normalized(std::span<const adapter> clients, std::span<const double> weights) {
  if (clients.empty()) throw std::invalid_argument("lora: no adapters to aggregate");
  if (weights.size() != clients.size())
    throw std::invalid_argument("lora: " + std::to_string(weights.size()) + " weights for " +
                                std::to_string(clients.size()) + " adapters");
  double sum = 0;
  for (double w : weights) {
    if (!std::isfinite(w) || w < 0) throw std::invalid_argument("lora: a weight is negative or not finite");
    sum += w;
  }
  std::vector<double> out(weights.begin(), weights.end());
  for (double& w : out) w = sum > 0 ? w / sum : 1.0 / static_cast<double>(out.size());  // all zero: the plain mean
  return out;
}

/// out += w * b a.
void add_product(const adapter& x, layer_shape shape, double w, std::vector<double>& out) {
  const std::int64_t r = x.rank;
  for (std::int64_t i = 0; i < shape.out; ++i)
    for (std::int64_t t = 0; t < r; ++t) {
      const double bt = w * x.b[static_cast<std::size_t>(i * r + t)];
      if (bt == 0) continue;
      const float* a = x.a.data() + t * shape.in;
      double* o = out.data() + i * shape.in;
      for (std::int64_t j = 0; j < shape.in; ++j) o[j] += bt * a[j];
    }
}

}  // namespace

rule parse_rule(const std::string& name) {
  if (name == "fedit") return rule::fedit;
  if (name == "fedex") return rule::fedex;
  if (name == "flexlora") return rule::flexlora;
  if (name == "hetlora") return rule::hetlora;
  throw std::invalid_argument("unknown --lora-agg '" + name + "' (use fedit, fedex, flexlora or hetlora)");
}

const char* name_of(rule r) noexcept {
  switch (r) {
    case rule::fedit: return "fedit";
    case rule::fedex: return "fedex";
    case rule::flexlora: return "flexlora";
    case rule::hetlora: return "hetlora";
  }
  return "?";
}

std::vector<std::int64_t> parse_ranks(const std::string& spec) {
  std::vector<std::int64_t> ranks;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = spec.find(',', at);
    const std::string part = spec.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    std::int64_t r = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), r);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || r < 1 || r > 4096)
      throw std::invalid_argument("--lora '" + spec + "': '" + part +
                                  "' is not a rank (a whole number from 1 to 4096; several ranks as 2,4,8)");
    ranks.push_back(r);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return ranks;
}

std::vector<double> product(const adapter& x, layer_shape shape) {
  check_fits(x, shape);
  std::vector<double> out(static_cast<std::size_t>(shape.out * shape.in), 0.0);
  add_product(x, shape, 1.0, out);
  return out;
}

adapter mean(std::span<const adapter> clients, std::span<const double> weights, layer_shape shape) {
  const auto w = normalized(clients, weights);
  const std::int64_t r = clients.front().rank;
  for (const auto& c : clients) {
    check_fits(c, shape);
    if (c.rank != r)
      throw std::invalid_argument("lora: averaging A and B needs one rank for every client (got " + std::to_string(r) +
                                  " and " + std::to_string(c.rank) + "); use --lora-agg flexlora or hetlora for mixed ranks");
  }
  std::vector<double> a(clients.front().a.size(), 0.0), b(clients.front().b.size(), 0.0);
  for (std::size_t k = 0; k < clients.size(); ++k) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += w[k] * clients[k].a[i];
    for (std::size_t i = 0; i < b.size(); ++i) b[i] += w[k] * clients[k].b[i];
  }
  adapter m{r, std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end())};
  return m;
}

fedex_result fedex(std::span<const adapter> clients, std::span<const double> weights, layer_shape shape) {
  fedex_result out;
  out.mean = mean(clients, weights, shape);
  const auto w = normalized(clients, weights);
  out.residual.assign(static_cast<std::size_t>(shape.out * shape.in), 0.0);
  for (std::size_t k = 0; k < clients.size(); ++k) add_product(clients[k], shape, w[k], out.residual);
  // Minus the product of the means as the model will use them: the rounded float means.
  add_product(out.mean, shape, -1.0, out.residual);
  return out;
}

std::vector<double> weighted_product_sum(std::span<const adapter> clients, std::span<const double> weights,
                                         layer_shape shape) {
  const auto w = normalized(clients, weights);
  std::vector<double> out(static_cast<std::size_t>(shape.out * shape.in), 0.0);
  for (std::size_t k = 0; k < clients.size(); ++k) {
    check_fits(clients[k], shape);
    add_product(clients[k], shape, w[k], out);
  }
  return out;
}

truncation truncate(std::span<const double> delta, layer_shape shape, std::int64_t rank) {
  if (rank < 1) throw std::invalid_argument("lora: a truncation needs a rank of at least 1");
  if (delta.size() != static_cast<std::size_t>(shape.out * shape.in))
    throw std::invalid_argument("lora: a change of " + std::to_string(delta.size()) + " values for a " +
                                std::to_string(shape.out) + " x " + std::to_string(shape.in) + " layer");
  const auto d = kernels::svd(delta, shape.out, shape.in);
  truncation t;
  t.singular_values = d.s;
  const std::int64_t keep = std::min(rank, d.k);
  t.factors.rank = rank;
  t.factors.a.assign(static_cast<std::size_t>(rank * shape.in), 0.0f);
  t.factors.b.assign(static_cast<std::size_t>(shape.out * rank), 0.0f);
  for (std::int64_t r = 0; r < keep; ++r) {
    const double root = std::sqrt(d.s[static_cast<std::size_t>(r)]);  // sigma split evenly: B = U S^1/2, A = S^1/2 V^T
    for (std::int64_t j = 0; j < shape.in; ++j)
      t.factors.a[static_cast<std::size_t>(r * shape.in + j)] =
          static_cast<float>(root * d.vt[static_cast<std::size_t>(r * shape.in + j)]);
    for (std::int64_t i = 0; i < shape.out; ++i)
      t.factors.b[static_cast<std::size_t>(i * rank + r)] = static_cast<float>(d.u[static_cast<std::size_t>(i * d.k + r)] * root);
  }
  for (std::int64_t r = keep; r < d.k; ++r) t.dropped += d.s[static_cast<std::size_t>(r)] * d.s[static_cast<std::size_t>(r)];
  return t;
}

adapter resize(const adapter& x, std::int64_t rank, layer_shape shape) {
  check_fits(x, shape);
  if (rank < 1) throw std::invalid_argument("lora: a rank of at least 1");
  adapter y{rank, std::vector<float>(static_cast<std::size_t>(rank * shape.in), 0.0f),
            std::vector<float>(static_cast<std::size_t>(shape.out * rank), 0.0f)};
  const std::int64_t keep = std::min(rank, x.rank);
  std::copy_n(x.a.begin(), keep * shape.in, y.a.begin());
  for (std::int64_t i = 0; i < shape.out; ++i)
    for (std::int64_t t = 0; t < keep; ++t)
      y.b[static_cast<std::size_t>(i * rank + t)] = x.b[static_cast<std::size_t>(i * x.rank + t)];
  return y;
}

adapter hetlora(std::span<const adapter> clients, std::int64_t max_rank, layer_shape shape,
                std::vector<double>* norm_weights) {
  if (clients.empty()) throw std::invalid_argument("lora: no adapters to aggregate");
  std::vector<double> norms;
  double total = 0;
  for (const auto& c : clients) {
    if (c.rank > max_rank)
      throw std::invalid_argument("lora: an adapter of rank " + std::to_string(c.rank) + " above the largest rank " +
                                  std::to_string(max_rank));
    const auto p = product(c, shape);
    double sq = 0;
    for (double v : p) sq += v * v;
    norms.push_back(std::sqrt(sq));
    total += norms.back();
  }
  for (double& n : norms) n = total > 0 ? n / total : 1.0 / static_cast<double>(clients.size());
  std::vector<double> a(static_cast<std::size_t>(max_rank * shape.in), 0.0), b(static_cast<std::size_t>(shape.out * max_rank), 0.0);
  for (std::size_t k = 0; k < clients.size(); ++k) {
    const adapter& c = clients[k];
    for (std::size_t i = 0; i < c.a.size(); ++i) a[i] += norms[k] * c.a[i];  // its rows come first
    for (std::int64_t i = 0; i < shape.out; ++i)
      for (std::int64_t t = 0; t < c.rank; ++t)
        b[static_cast<std::size_t>(i * max_rank + t)] += norms[k] * c.b[static_cast<std::size_t>(i * c.rank + t)];
  }
  if (norm_weights) *norm_weights = norms;
  return {max_rank, std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end())};
}

void adapter_gradients(const tensor& dw, const tensor& a, const tensor& b, float s, tensor& da, tensor& db) {
  kernels::gemm(b, true, dw, false, da, s, 0.0f);  // s B^T dW
  kernels::gemm(dw, false, a, true, db, s, 0.0f);  // s dW A^T
}

void adapter_gradients_reference(const tensor& dw, const tensor& a, const tensor& b, float s, tensor& da, tensor& db) {
  const std::int64_t out = dw.dim(0), in = dw.dim(1), r = a.dim(0);
  if (a.dim(1) != in || b.dim(0) != out || b.dim(1) != r || da.dim(0) != r || da.dim(1) != in || db.dim(0) != out ||
      db.dim(1) != r)
    throw std::invalid_argument("adapter_gradients_reference: shapes do not agree");
  const auto w = dw.data<float>(), av = a.data<float>(), bv = b.data<float>();
  auto ga = da.data<float>(), gb = db.data<float>();
  for (std::int64_t t = 0; t < r; ++t)
    for (std::int64_t j = 0; j < in; ++j) {
      double sum = 0;  // dL/dA[t][j] = s sum_i B[i][t] dW[i][j]
      for (std::int64_t i = 0; i < out; ++i) sum += static_cast<double>(bv[i * r + t]) * w[i * in + j];
      ga[t * in + j] = static_cast<float>(s * sum);
    }
  for (std::int64_t i = 0; i < out; ++i)
    for (std::int64_t t = 0; t < r; ++t) {
      double sum = 0;  // dL/dB[i][t] = s sum_j dW[i][j] A[t][j]
      for (std::int64_t j = 0; j < in; ++j) sum += static_cast<double>(w[i * in + j]) * av[t * in + j];
      gb[i * r + t] = static_cast<float>(s * sum);
    }
}

}  // namespace troupe::federated::lora
