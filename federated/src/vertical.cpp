// Vertical federated learning: the two parties as actors, the PSI that aligns them, the
// training loop that passes cut-layer activations and gradients between them, and the
// centralised baseline trained on the same batches.

#include "troupe/federated/vertical.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "troupe/actors/actor_system.hpp"
#include "troupe/federated/psi.hpp"
#include "troupe/kernels/data.hpp"

#include "engine.hpp"
#include "random.hpp"

namespace troupe::federated {
namespace {

using detail::since;

// Seed streams of a vertical run.
constexpr std::uint64_t stream_ids_a = 1, stream_ids_b = 2, stream_bottom_a = 3, stream_bottom_b = 4, stream_top = 5,
                        stream_batches = 6, stream_noise = 7;

/// Rows `examples` of `split`, the features `features` of each, normalized as the trainers do
/// (u8 pixels: (x / 255 - mean) / std; f32 features as they are).
tensor gather_features(const labelled_data& data, const dataset& split, std::span<const std::int64_t> examples,
                       const std::vector<std::int64_t>& features) {
  const std::int64_t rows = static_cast<std::int64_t>(examples.size()), d = static_cast<std::int64_t>(features.size());
  const std::int64_t width = split.size() > 0 ? split.images.numel() / split.size() : 0;
  tensor out = tensor::empty({rows, d});
  auto o = out.data<float>();
  if (split.images.type() == dtype::u8) {
    float table[256];
    for (int v = 0; v < 256; ++v) table[v] = (static_cast<float>(v) / 255.0f - data.mean) / data.stddev;
    auto px = split.images.data<std::uint8_t>();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < d; ++j) o[r * d + j] = table[px[examples[r] * width + features[j]]];
  } else {
    auto px = split.images.data<float>();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < d; ++j) o[r * d + j] = px[examples[r] * width + features[j]];
  }
  return out;
}

std::vector<std::int64_t> range(std::int64_t first, std::int64_t rows) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) v[i] = first + i;
  return v;
}

/// Party B: its features of the aligned examples and of the test set, its bottom model.
class feature_party {
public:
  feature_party(shared_data data, std::vector<std::int64_t> features, std::vector<std::int64_t> aligned,
                const vertical_shape& s, std::uint64_t seed, double lr)
      : data_(std::move(data)), features_(std::move(features)), aligned_(std::move(aligned)),
        bottom_(s.in_b, s.cut, seed, lr) {}
  /// The cut-layer activations of the aligned examples at `positions`.
  tensor forward(std::vector<std::uint32_t> positions) {
    std::vector<std::int64_t> rows(positions.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = aligned_.at(positions[i]);
    return bottom_.forward(gather_features(*data_, data_->train, rows, features_));
  }
  /// Steps on the gradient A sent back; returns its rows' L2 norms (what the norm attack scores).
  std::vector<double> backward(tensor grad) {
    auto g = grad.data<float>();
    const std::int64_t rows = grad.dim(0), c = grad.dim(1);
    std::vector<double> norms(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::int64_t j = 0; j < c; ++j) s += static_cast<double>(g[r * c + j]) * g[r * c + j];
      norms[r] = std::sqrt(s);
    }
    bottom_.backward(grad);
    bottom_.step();
    return norms;
  }
  tensor forward_test(std::int64_t first, std::int64_t rows) {
    kernels::saved_activations scratch;
    return bottom_.model().forward(gather_features(*data_, data_->test, range(first, rows), features_), scratch, false);
  }
private:
  shared_data data_;
  std::vector<std::int64_t> features_, aligned_;
  split_bottom bottom_;
};

struct label_step {
  tensor grad_b;              ///< what B receives (noised when cut_noise > 0)
  std::vector<double> clean;  ///< the rows' norms before the noise (measured here, never sent)
  double loss_sum = 0;
};

/// Party A: its features, the labels, its bottom model and the top.
class label_party {
public:
  label_party(shared_data data, std::vector<std::int64_t> features, std::vector<std::int64_t> aligned,
              const vertical_shape& s, std::uint64_t seed, double lr, double cut_noise)
      : data_(std::move(data)), features_(std::move(features)), aligned_(std::move(aligned)), cut_(s.cut),
        bottom_(s.in_a, s.cut, derive_seed(seed, stream_bottom_a), lr),
        top_(s, derive_seed(seed, stream_top), lr), noise_(cut_noise),
        draws_(derive_seed(seed, stream_noise)) {}

  label_step train(std::vector<std::uint32_t> positions, tensor h_b) {
    std::vector<std::int64_t> rows(positions.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = aligned_.at(positions[i]);
    const tensor h_a = bottom_.forward(gather_features(*data_, data_->train, rows, features_));
    const tensor labels = kernels_rows(data_->train.labels, rows);
    auto out = top_.forward_backward(concat_columns(h_a, h_b), labels);
    bottom_.backward(columns_of(out.dh, 0, cut_));
    label_step step;
    step.grad_b = columns_of(out.dh, cut_, 2 * cut_);
    step.loss_sum = out.loss_sum;
    auto g = step.grad_b.data<float>();
    step.clean.resize(rows.size());
    for (std::size_t r = 0; r < rows.size(); ++r) {
      double s = 0;
      for (std::int64_t j = 0; j < cut_; ++j) s += static_cast<double>(g[r * cut_ + j]) * g[r * cut_ + j];
      step.clean[r] = std::sqrt(s);
    }
    if (noise_ > 0)
      for (float& v : g) v += static_cast<float>(noise_ * draws_.next());
    top_.step();
    bottom_.step();
    return step;
  }
  /// Summed loss and correct predictions of test rows [first, first + rows) given B's activations.
  std::pair<double, std::int64_t> evaluate(std::int64_t first, std::int64_t rows, tensor h_b) {
    kernels::saved_activations scratch;
    const tensor h_a =
        bottom_.model().forward(gather_features(*data_, data_->test, range(first, rows), features_), scratch, false);
    const tensor logits = top_.logits(concat_columns(h_a, h_b));
    const tensor labels = data_->test.labels.slice(first, first + rows);
    tensor dl;
    const double loss = kernels::softmax_cross_entropy(logits, labels, dl) * static_cast<double>(rows);
    return {loss, kernels::count_correct(logits, labels)};
  }
private:
  static tensor kernels_rows(const tensor& labels, const std::vector<std::int64_t>& rows) {
    return gather_rows(labels, rows);
  }
  shared_data data_;
  std::vector<std::int64_t> features_, aligned_;
  std::int64_t cut_;
  split_bottom bottom_;
  split_top top_;
  double noise_;
  detail::normal_draws draws_;
};

/// A party's ID set: each training example with probability `overlap` (an example's ID is its index).
std::vector<std::uint64_t> id_set(std::int64_t n, double overlap, std::uint64_t seed) {
  splitmix64 g{seed};
  std::vector<std::uint64_t> ids;
  for (std::int64_t i = 0; i < n; ++i)
    if (g.uniform01() < overlap) ids.push_back(static_cast<std::uint64_t>(i));
  return ids;
}

/// The same model trained in one place: block_diagonal_model of pieces made from the parties'
/// seeds (so with their initial weights), plain SGD, the off-block gradients dropped.
class centralised {
public:
  centralised(shared_data data, const feature_split& fs, std::vector<std::int64_t> aligned, const vertical_shape& s,
              std::uint64_t seed, double lr)
      : data_(std::move(data)), aligned_(std::move(aligned)), shape_(s) {
    features_ = fs.a;
    features_.insert(features_.end(), fs.b.begin(), fs.b.end());
    split_bottom a(s.in_a, s.cut, derive_seed(seed, stream_bottom_a), lr);
    split_bottom b(s.in_b, s.cut, derive_seed(seed, stream_bottom_b), lr);
    split_top top(s, derive_seed(seed, stream_top), lr);
    model_ = block_diagonal_model(s, a, b, top);
    kernels::hyperparameters hp;
    hp.lr = lr;
    opt_ = std::make_unique<kernels::optimizer>(kernels::optimizer_kind::sgd,
                                                std::vector<kernels::param_group>{{model_->parameters(), hp, {}}});
  }
  void train(const std::vector<std::uint32_t>& positions) {
    std::vector<std::int64_t> rows(positions.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = aligned_[positions[i]];
    kernels::saved_activations keep;
    const tensor logits = model_->forward(gather_features(*data_, data_->train, rows, features_), keep, true);
    tensor dl;
    kernels::softmax_cross_entropy(logits, gather_rows(data_->train.labels, rows), dl);
    model_->backward(dl, keep);
    mask_off_block_gradients(*model_, shape_);
    opt_->step();
    opt_->zero_grad();
  }
  double accuracy(std::int64_t test_rows) {
    std::int64_t correct = 0;
    for (std::int64_t first = 0; first < test_rows; first += 1000) {
      const std::int64_t rows = std::min<std::int64_t>(1000, test_rows - first);
      kernels::saved_activations scratch;
      const tensor logits = model_->forward(gather_features(*data_, data_->test, range(first, rows), features_), scratch, false);
      correct += kernels::count_correct(logits, data_->test.labels.slice(first, first + rows));
    }
    return static_cast<double>(correct) / static_cast<double>(test_rows);
  }

private:
  shared_data data_;
  std::vector<std::int64_t> aligned_, features_;
  vertical_shape shape_;
  std::unique_ptr<kernels::sequential> model_;
  std::unique_ptr<kernels::optimizer> opt_;
};

void check(const vertical_options& o) {
  if (!(o.overlap > 0 && o.overlap <= 1))
    throw std::invalid_argument("--vertical-overlap must be in (0, 1], not " + std::to_string(o.overlap));
  if (o.epochs < 1) throw std::invalid_argument("--rounds (epochs under --vertical) must be at least 1");
  if (o.batch < 1) throw std::invalid_argument("--batch must be at least 1");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw std::invalid_argument("--lr must be positive");
  if (!(o.cut_noise >= 0) || !std::isfinite(o.cut_noise))
    throw std::invalid_argument("--cut-noise must be a finite standard deviation >= 0");
  if (o.eval_every < 1) throw std::invalid_argument("--eval-every must be at least 1");
}

}  // namespace

vertical_summary run_vertical(const vertical_options& o, const std::function<void(const vertical_progress&)>& report) {
  check(o);
  const auto t0 = detail::clock_type::now();
  simulation_options so;
  so.data = o.data;
  so.data_dir = o.data_dir;
  so.train_limit = o.train_limit;
  const shared_data data = detail::load_data(so);
  const feature_split fs = split_features(*data);
  const vertical_shape shape = split_shape(o.model, static_cast<std::int64_t>(fs.a.size() + fs.b.size()));
  if (o.leakage_class >= data->classes)
    throw std::invalid_argument("--leakage-class must be a class of the data (0.." + std::to_string(data->classes - 1) + ")");
  const int leakage_class = o.leakage_class >= 0 ? o.leakage_class : std::min(6, data->classes - 1);

  // Each party's own IDs, then the intersection by PSI: training sees only what both hold.
  vertical_summary sum;
  sum.leakage_class = leakage_class;
  const std::int64_t n = data->train.size();
  auto ids_a = id_set(n, o.overlap, derive_seed(o.seed, stream_ids_a));
  auto ids_b = id_set(n, o.overlap, derive_seed(o.seed, stream_ids_b));
  sum.ids_a = ids_a.size();
  sum.ids_b = ids_b.size();
  const psi_outcome psi = run_psi(std::move(ids_a), std::move(ids_b), o.threads);
  sum.psi_intersection = psi.intersection.size();
  sum.psi_seconds = psi.seconds;
  sum.psi_bytes = psi.transcript_bytes;
  if (psi.intersection.empty()) throw std::invalid_argument("the parties' ID sets do not intersect: raise --vertical-overlap");
  const std::vector<std::int64_t> aligned(psi.intersection.begin(), psi.intersection.end());

  actor_system sys{system_config{.threads = 2}};
  auto b = sys.spawn<feature_party>(data, fs.b, aligned, shape, derive_seed(o.seed, stream_bottom_b), o.lr);
  auto a = sys.spawn<label_party>(data, fs.a, aligned, shape, o.seed, o.lr, o.cut_noise);

  // The centralised baseline: the same model in one place, from the same initial weights,
  // trained on the same batches.
  std::unique_ptr<centralised> whole;
  if (o.centralised) whole = std::make_unique<centralised>(data, fs, aligned, shape, o.seed, o.lr);

  const std::int64_t m = static_cast<std::int64_t>(aligned.size());
  const std::int64_t test_rows = o.test_limit > 0 ? std::min<std::int64_t>(o.test_limit, data->test.size()) : data->test.size();
  std::vector<double> scores_clean, scores_noised;
  std::vector<std::uint8_t> positive;
  double bytes = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto order = shuffled_indices(m, derive_seed(o.seed, stream_batches + (static_cast<std::uint64_t>(epoch) << 32)));
    const bool last = epoch == o.epochs;
    double loss_sum = 0;
    for (std::int64_t s = 0; s < m; s += o.batch) {
      const std::int64_t rows = std::min<std::int64_t>(o.batch, m - s);
      std::vector<std::uint32_t> positions(static_cast<std::size_t>(rows));
      for (std::int64_t i = 0; i < rows; ++i) positions[i] = static_cast<std::uint32_t>(order[s + i]);
      // A -> B: the batch (positions in the aligned list); B -> A: its activations; A -> B: their gradient.
      auto forward = b.ask(&feature_party::forward, positions);
      if (whole) whole->train(positions);  // meanwhile, on this thread
      tensor h_b = forward.get();
      bytes += static_cast<double>(positions.size() * sizeof(std::uint32_t) + h_b.nbytes());
      label_step step = a.ask(&label_party::train, positions, h_b).get();
      bytes += static_cast<double>(step.grad_b.nbytes());
      std::vector<double> received = b.ask(&feature_party::backward, step.grad_b).get();
      loss_sum += step.loss_sum;
      ++sum.steps;
      if (last) {
        scores_clean.insert(scores_clean.end(), step.clean.begin(), step.clean.end());
        scores_noised.insert(scores_noised.end(), received.begin(), received.end());
        auto labels = data->train.labels.data<std::uint8_t>();
        for (auto p : positions) positive.push_back(labels[aligned[p]] == leakage_class);
      }
    }
    if (epoch % o.eval_every == 0 || last) {
      double tl = 0;
      std::int64_t correct = 0;
      for (std::int64_t first = 0; first < test_rows; first += 1000) {
        const std::int64_t rows = std::min<std::int64_t>(1000, test_rows - first);
        tensor h_b = b.ask(&feature_party::forward_test, first, rows).get();
        auto [l, c] = a.ask(&label_party::evaluate, first, rows, h_b).get();
        tl += l;
        correct += c;
      }
      sum.final_accuracy = static_cast<double>(correct) / static_cast<double>(test_rows);
      if (whole) sum.centralised_accuracy = whole->accuracy(test_rows);
      sum.final_loss = tl / static_cast<double>(test_rows);
      if (report)
        report({epoch, o.epochs, sum.final_accuracy, sum.final_loss, loss_sum / static_cast<double>(m), since(t0)});
    }
  }
  sum.bytes_per_step = bytes / static_cast<double>(sum.steps);
  const bool has_both = std::count(positive.begin(), positive.end(), 1) > 0 && std::count(positive.begin(), positive.end(), 0) > 0;
  sum.label_leakage_auc = has_both ? roc_auc(scores_clean, positive) : std::nan("");
  if (o.cut_noise > 0) sum.label_leakage_auc_noised = has_both ? roc_auc(scores_noised, positive) : std::nan("");
  sum.seconds = since(t0);
  return sum;
}

}  // namespace troupe::federated
