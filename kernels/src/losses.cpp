// The losses on a classifier's logits: softmax cross-entropy (with its gradient) and the count
// of correct rows.

#include "troupe/kernels/layers.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda_ops.hpp"
#include "layer_device.hpp"

namespace troupe::kernels {

namespace {

using detail::fp;
using detail::on_device;

std::int64_t label_at(const tensor& labels, std::int64_t i) {
  switch (labels.type()) {
    case dtype::u8: return labels.data<std::uint8_t>()[i];
    case dtype::i32: return labels.data<std::int32_t>()[i];
    case dtype::i64: return labels.data<std::int64_t>()[i];
    default: throw std::invalid_argument("labels must be u8, i32 or i64, not " + labels.str());
  }
}

/// Logits f32 [N, C] with N, C >= 1 and labels [N]; `what` names the caller in the errors.
void check_logits(const tensor& logits, const tensor& labels, const char* what) {
  if (logits.rank() != 2 || logits.type() != dtype::f32 || logits.dim(0) < 1 || logits.dim(1) < 1)
    throw std::invalid_argument(std::string(what) + " expects f32 logits [N, C] with N, C >= 1, got " + logits.str());
  if (labels.rank() != 1 || labels.dim(0) != logits.dim(0))
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(logits.dim(0)) + " rows of logits but labels " +
                                labels.str());
}

std::int64_t checked_label(const tensor& labels, std::int64_t i, std::int64_t classes) {
  const std::int64_t y = label_at(labels, i);
  if (y < 0 || y >= classes)
    throw std::invalid_argument("label " + std::to_string(y) + " of row " + std::to_string(i) + " is outside 0.." +
                                std::to_string(classes - 1));
  return y;
}
}  // namespace

double softmax_cross_entropy(const tensor& logits, const tensor& labels, tensor& dlogits) {
  check_logits(logits, labels, "softmax_cross_entropy");
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
  if (!dlogits.defined() || dlogits.shape() != logits.shape() || dlogits.where() != logits.where())
    dlogits = tensor::empty(logits.shape(), dtype::f32, logits.where());
  if (on_device(logits)) {
    // Labels as int64 on the logits' device.
    tensor host = labels.to(device::cpu()), wide = tensor::empty({n}, dtype::i64);
    for (std::int64_t i = 0; i < n; ++i) wide.data<std::int64_t>()[i] = checked_label(host, i, c);
    const tensor dev = wide.to(logits.where());
    return cuda::softmax_cross_entropy(logits.where().index, fp(logits),
                                       reinterpret_cast<const std::int64_t*>(dev.bytes()), fp(dlogits), n, c);
  }
  auto z = logits.data<float>();
  auto g = dlogits.data<float>();
  double loss = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t y = checked_label(labels, i, c);
    const float* row = z.data() + i * c;
    float top = row[0];
    for (std::int64_t j = 1; j < c; ++j) top = std::max(top, row[j]);
    double sum = 0;
    for (std::int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(row[j]) - top);
    loss += std::log(sum) + top - row[y];
    for (std::int64_t j = 0; j < c; ++j) {
      const double p = std::exp(static_cast<double>(row[j]) - top) / sum;
      g[i * c + j] = static_cast<float>((p - (j == y ? 1.0 : 0.0)) / static_cast<double>(n));
    }
  }
  return loss / static_cast<double>(n);
}

std::int64_t count_correct(const tensor& logits_in, const tensor& labels_in) {
  const tensor logits = logits_in.to(device::cpu()), labels = labels_in.to(device::cpu());
  check_logits(logits, labels, "count_correct");
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
  auto z = logits.data<float>();
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < c; ++j)
      if (z[i * c + j] > z[i * c + best]) best = j;
    if (best == checked_label(labels, i, c)) ++correct;
  }
  return correct;
}

}  // namespace troupe::kernels
