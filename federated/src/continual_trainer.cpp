// --continual's trainer (continual_trainer.hpp): the mlp trainer's SGD on the job's task, with
// EWC's term or GPM's projection at every step, and the clients' consolidation computations.

#include "continual_trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "engine.hpp"
#include "troupe/kernels/data.hpp"
#include "troupe/kernels/gemm.hpp"

namespace troupe::federated::detail {

continual_trainer::continual_trainer(shared_data data, const simulation_options& o, std::shared_ptr<continual_state> state)
    : data_(std::move(data)), batches_(data_), stack_(o, batches_.pixels(), data_->classes, /*on_device=*/false),
      state_(std::move(state)), test_limit_(o.test_limit) {
  pixels_ = batches_.pixels();
  const auto& tasks = state_->tasks;
  if (tasks.type == continual_tasks::kind::split && tasks.tasks > data_->classes)
    throw std::invalid_argument("--continual split:" + std::to_string(tasks.tasks) + ": the data has only " +
                                std::to_string(data_->classes) + " classes to split");
  if (tasks.type == continual_tasks::kind::permuted)
    for (int t = 0; t < tasks.tasks; ++t)
      perms_.push_back(task_permutation(state_->seed, t, static_cast<std::size_t>(pixels_)));
  std::size_t at = 0;
  for (std::size_t i = 0; i < stack_.model->size(); ++i) {
    auto params = stack_.model->at(i).parameters();
    if (stack_.model->at(i).describe().rfind("linear(", 0) == 0) {
      const auto& w = params.at(0)->value;
      sizes_.emplace_back(static_cast<std::size_t>(w.dim(1)), static_cast<std::size_t>(w.dim(0)));
      offsets_.push_back(at);
    }
    for (auto* p : params) at += static_cast<std::size_t>(p->value.numel());
  }
}

void continual_trainer::initialize(std::span<float> model, std::uint64_t seed) { stack_.initial_weights(model, seed); }

std::span<const std::uint32_t> continual_trainer::task_rows(std::span<const std::uint32_t> shard, int task) {
  if (state_->tasks.type == continual_tasks::kind::permuted) return shard;
  const auto [first, last] = split_classes(task, state_->tasks.tasks, data_->classes);
  const std::uint8_t* labels = data_->train.labels.data<std::uint8_t>().data();
  rows_.clear();
  for (std::uint32_t i : shard)
    if (labels[i] >= first && labels[i] < last) rows_.push_back(i);
  return rows_;
}

void continual_trainer::permute(int task, std::size_t rows) {
  if (perms_.empty() || task == 0) return;  // split tasks, and the first permuted task: as they are
  const std::uint32_t* p = perms_[static_cast<std::size_t>(task)].data();
  const std::size_t d = static_cast<std::size_t>(pixels_);
  pixel_scratch_.resize(d);
  float* x = batches_.x();
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = x + r * d;
    std::memcpy(pixel_scratch_.data(), row, d * sizeof(float));
    for (std::size_t j = 0; j < d; ++j) row[j] = pixel_scratch_[p[j]];
  }
}

local_result continual_trainer::train(const local_job& job, std::span<float> model, splitmix64& rng) {
  const continual_state& s = *state_;
  const int task = s.task_of(job.round);
  const auto shard = task_rows(job.shard, task);
  local_result r;
  order_.assign(shard.begin(), shard.end());
  const std::size_t n = order_.size(), batch = static_cast<std::size_t>(job.batch);
  batches_.reserve(std::min(batch, n));
  const dataset& train = data_->train;
  kernels::gradient_terms terms;
  if (job.proximal_mu > 0) {
    terms.mu = static_cast<float>(job.proximal_mu);
    terms.center = job.global.data();
  }
  if (!job.correction.empty()) terms.correction = job.correction.data();
  const bool ewc = s.method.type == continual_method::kind::ewc && s.ewc.tasks() > 0;
  const bool ewc_proximal = ewc && s.ewc_proximal, ewc_gradient = ewc && !s.ewc_proximal;
  bool gpm = false;
  for (const auto& b : s.bases) gpm = gpm || b.k > 0;
  if (ewc_gradient) {
    correction_.resize(dim());
    terms.correction = correction_.data();
  }
  stack_.opt->groups().front().hp.lr = job.lr;
  stack_.net->load_flat(model.data());
  if (job.start_loss) {  // q-FedAvg's F_k on the task's examples
    double loss = 0;
    std::int64_t correct = 0;
    for (std::size_t at = 0; at < n; at += 240) {
      const std::size_t m = std::min<std::size_t>(240, n - at);
      batches_.reserve(m);
      batches_.gather(train, order_.data() + at, m);
      permute(task, m);
      stack_.net->evaluate(batches_.x(), batches_.y(), static_cast<int>(m), loss, correct);
    }
    r.start_loss = n > 0 ? loss / static_cast<double>(n) : 0.0;
    batches_.reserve(std::min(batch, n));
  }
  if (job.optimizer_state) {
    if (job.optimizer_state->empty())
      stack_.opt->reset_state();
    else
      stack_.opt->load_state(*job.optimizer_state);
  }
  double loss = 0;
  const std::int64_t step_limit = n > 0 ? job.steps : 0;
  for (int e = 0; step_limit > 0 ? r.steps + r.skipped < step_limit : e < job.epochs; ++e) {
    for (std::size_t i = n; i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
    for (std::size_t at = 0; at < n; at += batch) {
      if (step_limit > 0 && r.steps + r.skipped == step_limit) break;
      const std::size_t rows = std::min(batch, n - at);
      batches_.gather(train, order_.data() + at, rows);
      permute(task, rows);
      const auto theta = stack_.net->flat_parameters();
      if (ewc_gradient) {  // lambda sum_t F_t (theta - theta*_t), at the weights this step starts from
        s.ewc.gradient(theta, static_cast<float>(s.method.lambda), correction_);
        if (!job.correction.empty())
          for (std::size_t i = 0; i < correction_.size(); ++i) correction_[i] += job.correction[i];
      }
      if (gpm) before_.assign(theta.begin(), theta.end());
      const kernels::batch_outcome b = stack_.net->step(batches_.x(), batches_.y(), static_cast<int>(rows), terms);
      if (gpm && b.applied) project_step(before_.data());
      if (ewc_proximal && b.applied) s.ewc.proximal(stack_.net->flat_parameters(), job.lr, s.method.lambda);
      loss += b.loss_sum;
      ++(b.applied ? r.steps : r.skipped);
      r.samples += static_cast<std::int64_t>(rows);
    }
  }
  stack_.net->store_flat(model.data());
  if (job.optimizer_state) *job.optimizer_state = stack_.opt->save_state();
  r.loss = r.samples ? loss / static_cast<double>(r.samples) : 0.0;
  return r;
}

void continual_trainer::project_step(const float* before) {
  const continual_state& s = *state_;
  float* theta = stack_.net->flat_parameters().data();
  for (std::size_t l = 0; l < sizes_.size() && l < s.bases.size(); ++l) {
    const std::size_t k = s.bases[l].k;
    if (k == 0) continue;
    const auto [in, out] = sizes_[l];
    const std::size_t d = in + 1, ow = offsets_[l], ob = ow + in * out;
    auto shaped = [](tensor& t, std::size_t rows, std::size_t cols) {
      if (!t.defined() || t.dim(0) != static_cast<std::int64_t>(rows) || t.dim(1) != static_cast<std::int64_t>(cols))
        t = tensor::empty({static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols)});
    };
    shaped(d_, out, d);
    float* dd = d_.data<float>().data();
    for (std::size_t o = 0; o < out; ++o) {
      for (std::size_t i = 0; i < in; ++i) dd[o * d + i] = theta[ow + o * in + i] - before[ow + o * in + i];
      dd[o * d + in] = theta[ob + o] - before[ob + o];
    }
    // M^T as a k x d row-major tensor (bases_f holds the columns one after another); the basis
    // only grows, so its k says whether the copy is current.
    if (m_.size() <= l) m_.resize(sizes_.size()), m_k_.resize(sizes_.size(), 0);
    if (m_k_[l] != k) {
      m_[l] = tensor::from<float>(std::span<const float>(s.bases_f[l]), {static_cast<std::int64_t>(k), static_cast<std::int64_t>(d)});
      m_k_[l] = k;
    }
    shaped(t_, out, k);
    kernels::gemm(d_, false, m_[l], true, t_);               // T = D M
    kernels::gemm(t_, false, m_[l], false, d_, -1.0f, 1.0f); // D -= T M^T
    for (std::size_t o = 0; o < out; ++o) {
      for (std::size_t i = 0; i < in; ++i) theta[ow + o * in + i] = before[ow + o * in + i] + dd[o * d + i];
      theta[ob + o] = before[ob + o] + dd[o * d + in];
    }
  }
}

evaluation continual_trainer::evaluate_task(int task) {
  const dataset& test = data_->test;
  const std::size_t total = static_cast<std::size_t>(test.size());
  const std::size_t limit = test_limit_ ? std::min(test_limit_, total) : total;
  test_rows_.clear();
  if (state_->tasks.type == continual_tasks::kind::split) {
    const auto [first, last] = split_classes(task, state_->tasks.tasks, data_->classes);
    const std::uint8_t* labels = test.labels.data<std::uint8_t>().data();
    for (std::size_t i = 0; i < limit; ++i)
      if (labels[i] >= first && labels[i] < last) test_rows_.push_back(static_cast<std::uint32_t>(i));
  } else {
    for (std::size_t i = 0; i < limit; ++i) test_rows_.push_back(static_cast<std::uint32_t>(i));
  }
  const std::size_t n = test_rows_.size(), chunk = 240;
  if (n == 0) return {std::nan(""), std::nan(""), {}};
  batches_.reserve(chunk);
  double loss = 0;
  std::int64_t correct = 0;
  for (std::size_t at = 0; at < n; at += chunk) {
    const std::size_t m = std::min(chunk, n - at);
    batches_.gather(test, test_rows_.data() + at, m);
    permute(task, m);
    stack_.net->evaluate(batches_.x(), batches_.y(), static_cast<int>(m), loss, correct);
  }
  return {static_cast<double>(correct) / static_cast<double>(n), loss / static_cast<double>(n), {}};
}

evaluation continual_trainer::evaluate(std::span<const float> model) {
  stack_.net->load_flat(model.data());
  const int seen = std::clamp(state_->seen.load(), 1, state_->tasks.tasks);
  evaluation out;
  for (int t = 0; t < seen; ++t) {
    const evaluation e = evaluate_task(t);
    out.accuracy += e.accuracy / seen;
    out.loss += e.loss / seen;
    out.metrics.emplace_back("task_" + std::to_string(t + 1) + "_accuracy", e.accuracy);
  }
  return out;
}

void continual_trainer::check_optimizer_state(std::span<const std::byte> state) {
  if (state.empty()) return;
  try {
    stack_.opt->load_state(state);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
}

std::size_t continual_trainer::fisher_sum(std::span<const std::uint32_t> shard, int task, std::span<const float> model,
                                          std::vector<double>& sum) {
  sum.assign(dim(), 0.0);
  const auto rows = task_rows(shard, task);
  const std::vector<std::uint32_t> mine(rows.begin(), rows.end());  // task_rows' buffer is reused below
  stack_.net->load_flat(model.data());
  const std::size_t chunk = 100, layers = stack_.model->size();
  std::vector<kernels::saved_activations> keep(layers);
  std::vector<tensor> inputs(layers), dys(layers);
  for (std::size_t at = 0; at < mine.size(); at += chunk) {
    const std::size_t m = std::min(chunk, mine.size() - at);
    batches_.reserve(m);
    batches_.gather(data_->train, mine.data() + at, m);
    permute(task, m);
    tensor x = tensor::from<float>(std::span<const float>(batches_.x(), m * static_cast<std::size_t>(pixels_)),
                                   {static_cast<std::int64_t>(m), pixels_});
    for (std::size_t i = 0; i < layers; ++i) {
      inputs[i] = x;
      keep[i].clear();
      x = stack_.model->at(i).forward(x, keep[i], false);
    }
    tensor labels = tensor::from<std::uint8_t>(std::span<const std::uint8_t>(batches_.y(), m), {static_cast<std::int64_t>(m)});
    tensor dy;
    (void)kernels::softmax_cross_entropy(x, labels, dy);
    // The loss is the batch's mean: each row's own gradient is m times its share.
    for (float& v : dy.data<float>()) v *= static_cast<float>(m);
    for (std::size_t i = layers; i-- > 0;) {
      dys[i] = dy;
      if (i > 0) dy = stack_.model->at(i).backward_input(dy, keep[i]);
    }
    // Per example, a linear layer's weight gradient is dy a^T: its square summed over the rows is
    // (dy o dy)^T (a o a), its bias's the column sums of dy o dy.
    std::size_t l = 0;
    for (std::size_t i = 0; i < layers; ++i) {
      if (stack_.model->at(i).describe().rfind("linear(", 0) != 0) continue;
      const auto [in, out] = sizes_[l];
      tensor a2 = inputs[i].clone(), dy2 = dys[i].clone();
      for (float& v : a2.data<float>()) v *= v;
      for (float& v : dy2.data<float>()) v *= v;
      tensor g = tensor::empty({static_cast<std::int64_t>(out), static_cast<std::int64_t>(in)});
      kernels::gemm(dy2, true, a2, false, g);
      const auto gv = std::as_const(g).data<float>();
      double* fw = sum.data() + offsets_[l];
      for (std::size_t j = 0; j < gv.size(); ++j) fw[j] += gv[j];
      const auto dv = std::as_const(dy2).data<float>();
      double* fb = fw + in * out;
      for (std::size_t r = 0; r < m; ++r)
        for (std::size_t o = 0; o < out; ++o) fb[o] += dv[r * out + o];
      ++l;
    }
  }
  return mine.size();
}

std::vector<std::vector<double>> continual_trainer::layer_inputs(std::span<const std::uint32_t> shard, int task,
                                                                 std::span<const float> model, std::size_t limit,
                                                                 splitmix64& rng, std::size_t& rows) {
  const auto all = task_rows(shard, task);
  std::vector<std::uint32_t> pick(all.begin(), all.end());
  // A seeded choice of `limit` of them: the first `limit` of a partial Fisher-Yates shuffle.
  const std::size_t m = std::min(limit, pick.size());
  for (std::size_t i = 0; i < m; ++i) std::swap(pick[i], pick[i + rng.below(pick.size() - i)]);
  pick.resize(m);
  rows = m;
  std::vector<std::vector<double>> out(sizes_.size());
  if (m == 0) return out;
  stack_.net->load_flat(model.data());
  batches_.reserve(m);
  batches_.gather(data_->train, pick.data(), m);
  permute(task, m);
  tensor x = tensor::from<float>(std::span<const float>(batches_.x(), m * static_cast<std::size_t>(pixels_)),
                                 {static_cast<std::int64_t>(m), pixels_});
  std::size_t l = 0;
  for (std::size_t i = 0; i < stack_.model->size(); ++i) {
    if (stack_.model->at(i).describe().rfind("linear(", 0) == 0) {
      const std::size_t in = sizes_[l].first;
      const auto v = std::as_const(x).data<float>();
      auto& a = out[l];
      a.resize(m * (in + 1));
      for (std::size_t r = 0; r < m; ++r) {
        for (std::size_t j = 0; j < in; ++j) a[r * (in + 1) + j] = v[r * in + j];
        a[r * (in + 1) + in] = 1.0;
      }
      ++l;
    }
    kernels::saved_activations keep;
    x = stack_.model->at(i).forward(x, keep, false);
  }
  return out;
}

trainer_factory make_continual_trainer_factory(const simulation_options& o) {
  auto state = std::make_shared<continual_state>();
  state->tasks = parse_continual(o.continual);
  state->method = parse_cl(o.cl);
  state->task_rounds = o.task_rounds > 0 ? o.task_rounds : o.rounds / state->tasks.tasks;
  state->seed = derive_seed(o.seed, stream_continual);
  state->ewc_proximal = o.client_optimizer == "sgd";
  return [o, state](const shared_data& data) -> std::unique_ptr<local_trainer> {
    if (!data) throw std::invalid_argument("--continual needs the training data (the noop trainer has none)");
    return std::make_unique<continual_trainer>(data, o, state);
  };
}

}  // namespace troupe::federated::detail
