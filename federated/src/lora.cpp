// LoRA fine-tuning in the simulation (simulation_options::lora): the clients' trainer, the
// encoding of what they upload, and the server's side (lora.hpp's rules).
//
// The global vector the engine broadcasts holds three parts:
//   base     the model's own parameters (W0 and the biases), frozen on the clients; FedEx-LoRA
//            folds its residual into the weights here
//   state    per linear layer the global adapter: A [R, in] then s B [out, R] (fedit, fedex:
//            R the clients' rank; hetlora: R the largest rank), or FlexLoRA's full-size change
//            sum_k w_k s_k B_k A_k [out, in]
//   payload  per linear layer room for one client's A [r, in] and B [out, r] (r <= the largest
//            rank), zero in the global model
// A client leaves base and state as they came and writes its trained adapters into the
// payload, so its delta is exactly zero outside the payload and exactly its adapters inside.
// The uplink transform sends only those floats (as words: 4 bytes each); the aggregator
// decodes them, applies the rule and hands the lora server strategy a vector that it adds to
// base (FedEx's residual) and puts in place of state.
//
// The client's step: W = W0 + s B A is written into the layer before each batch, the layer's
// own forward and backward give the full weight gradient dW [out, in], and
//   dA = s B^T dW  [r, in],   dB = s dW A^T  [out, r]
// (the chain rule through W = W0 + s B A). SGD steps A and B only: W0 and the biases stay
// frozen.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "batches.hpp"
#include "engine.hpp"
#include "random.hpp"
#include "troupe/federated/lora.hpp"
#include "troupe/kernels/classifier.hpp"
#include "troupe/kernels/gemm.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::federated::detail {

namespace {

constexpr std::uint64_t stream_lora = 9ull << 32;  // + layer: the initial A

struct lora_layout {
  lora::rule rule = lora::rule::fedit;
  std::vector<std::int64_t> ranks;
  std::int64_t max_rank = 0;
  double alpha = 0;
  std::uint64_t seed = 0;
  std::size_t base = 0, payload_begin = 0, dim = 0;
  struct layer {
    std::size_t param = 0;       // in parameters() order
    std::size_t weight_at = 0;   // W0 in base
    std::size_t state_at = 0, payload_at = 0;
    lora::layer_shape shape;
  };
  std::vector<layer> layers;

  std::int64_t rank_of(std::uint64_t client) const { return ranks[client % ranks.size()]; }
  double scale(std::int64_t r) const { return alpha > 0 ? alpha / static_cast<double>(r) : 1.0; }
  bool dense_state() const { return rule == lora::rule::flexlora; }
  std::size_t payload_floats(std::int64_t r) const {
    std::size_t n = 0;
    for (const auto& l : layers) n += static_cast<std::size_t>(r * (l.shape.in + l.shape.out));
    return n;
  }
};

lora_layout make_layout(const simulation_options& o) {
  lora_layout L;
  L.rule = lora::parse_rule(o.lora_agg);
  L.ranks = lora::parse_ranks(o.lora);
  L.max_rank = *std::max_element(L.ranks.begin(), L.ranks.end());
  L.alpha = o.lora_alpha;
  L.seed = o.seed;
  auto model = make_model(o.model);
  const auto params = model->parameters();
  std::size_t at = 0;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const tensor& v = params[k]->value;
    const std::string& name = params[k]->name;
    const bool weight = name == "weight" || (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0);
    if (weight && v.rank() == 2) L.layers.push_back({k, at, 0, 0, {v.dim(0), v.dim(1)}});  // a linear layer's W [out, in]
    at += static_cast<std::size_t>(v.numel());
  }
  if (L.layers.empty()) throw std::invalid_argument("--lora: the model " + o.model + " has no linear layer to adapt");
  L.base = at;
  for (auto& l : L.layers) {
    l.state_at = at;
    at += static_cast<std::size_t>(L.dense_state() ? l.shape.out * l.shape.in : L.max_rank * (l.shape.in + l.shape.out));
  }
  L.payload_begin = at;
  for (auto& l : L.layers) {
    l.payload_at = at;
    at += static_cast<std::size_t>(L.max_rank * (l.shape.in + l.shape.out));
  }
  L.dim = at;
  return L;
}

/// LoRA's initial A for layer `l`, `rank` rows: Gaussian with variance 1 / in from the run's
/// seed (a smaller rank takes the first rows of the same draws).
std::vector<float> initial_a(const lora_layout& L, std::size_t l, std::int64_t rank) {
  const auto& s = L.layers[l].shape;
  normal_draws g{derive_seed(L.seed, stream_lora + l)};
  std::vector<float> a(static_cast<std::size_t>(rank * s.in));
  const double sd = 1.0 / std::sqrt(static_cast<double>(s.in));
  for (float& v : a) v = static_cast<float>(sd * g.next());
  return a;
}

/// The global adapter of layer `l` (scale folded into b) as stored in `global`'s state, for the
/// rules that keep one (not flexlora).
lora::adapter global_adapter(const lora_layout& L, std::size_t l, std::span<const float> global) {
  const auto& y = L.layers[l];
  const std::int64_t R = L.max_rank;
  const auto na = static_cast<std::size_t>(R * y.shape.in), nb = static_cast<std::size_t>(y.shape.out * R);
  const float* p = global.data() + y.state_at;
  return {R, std::vector<float>(p, p + na), std::vector<float>(p + na, p + na + nb)};
}

/// The adapter a client of rank r starts the round from, B unscaled (its trainable B).
lora::adapter start_adapter(const lora_layout& L, std::size_t l, std::span<const float> global, std::int64_t r) {
  const auto& y = L.layers[l];
  lora::adapter x;
  if (!L.dense_state()) {
    x = global_adapter(L, l, global);
    if (x.rank != r) x = lora::resize(x, r, y.shape);
  } else {
    const float* d = global.data() + y.state_at;
    const std::size_t n = static_cast<std::size_t>(y.shape.out * y.shape.in);
    if (std::all_of(d, d + n, [](float v) { return v == 0.0f; })) {  // before the first aggregate: LoRA's start
      return {r, initial_a(L, l, r), std::vector<float>(static_cast<std::size_t>(y.shape.out * r), 0.0f)};
    }
    x = lora::truncate(std::vector<double>(d, d + n), y.shape, r).factors;
  }
  const float inv = static_cast<float>(1.0 / L.scale(r));
  for (float& v : x.b) v *= inv;
  return x;
}

class lora_trainer final : public local_trainer {
public:
  lora_trainer(shared_data data, const simulation_options& o, std::shared_ptr<const lora_layout> layout)
      : data_(std::move(data)), batches_(data_), spec_(o.model), finetune_from_(o.finetune_from), L_(std::move(layout)),
        model_(make_model(o.model)), test_limit_(o.test_limit) {
    params_ = model_->parameters();
    kernels::hyperparameters hp;
    hp.lr = o.lr;
    base_opt_ = std::make_unique<kernels::optimizer>(kernels::optimizer_kind::sgd,
                                                     std::vector<kernels::param_group>{{params_, hp, {}}});
    try {
      net_ = std::make_unique<kernels::classifier>(*model_, *base_opt_, batches_.pixels());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("model '" + spec_ + "': " + e.what() + " (the images have " +
                                  std::to_string(batches_.pixels()) + " pixels)");
    }
    if (net_->classes() != data_->classes)
      throw std::invalid_argument("model '" + spec_ + "' has " + std::to_string(net_->classes()) +
                                  " outputs; the data has " + std::to_string(data_->classes) + " classes");
    w0_.resize(L_->layers.size());
  }

  std::size_t dim() const override { return L_->dim; }

  void initialize(std::span<float> model, std::uint64_t seed) override {
    std::fill(model.begin(), model.end(), 0.0f);
    const auto base = model.first(L_->base);
    if (!finetune_from_.empty()) {
      load_base_model(finetune_from_, spec_, base);
    } else {
      auto fresh = make_model(spec_);
      fresh->initialize(seed);
      std::size_t at = 0;
      for (auto* p : fresh->parameters())
        for (float v : std::as_const(p->value).data<float>()) base[at++] = v;
    }
    if (L_->dense_state()) return;  // FlexLoRA's change starts at zero
    for (std::size_t l = 0; l < L_->layers.size(); ++l) {  // A Gaussian, B zero
      const auto a = initial_a(*L_, l, L_->max_rank);
      std::copy(a.begin(), a.end(), model.begin() + static_cast<std::ptrdiff_t>(L_->layers[l].state_at));
    }
  }

  local_result train(const local_job& job, std::span<float> model, splitmix64& rng) override {
    const lora_layout& L = *L_;
    const std::int64_t r = L.rank_of(job.client);
    const float s = static_cast<float>(L.scale(r));
    net_->load_flat(model.data());
    std::vector<kernels::parameter> ab(2 * L.layers.size());
    std::vector<kernels::parameter*> trained;
    for (std::size_t l = 0; l < L.layers.size(); ++l) {
      const auto& y = L.layers[l];
      const auto w = std::as_const(params_[y.param]->value).data<float>();
      w0_[l].assign(w.begin(), w.end());
      lora::adapter x = start_adapter(L, l, job.global, r);
      ab[2 * l] = {"lora_a", tensor::from<float>(std::span<const float>(x.a), {r, y.shape.in}), tensor::zeros({r, y.shape.in})};
      ab[2 * l + 1] = {"lora_b", tensor::from<float>(std::span<const float>(x.b), {y.shape.out, r}),
                       tensor::zeros({y.shape.out, r})};
      trained.push_back(&ab[2 * l]);
      trained.push_back(&ab[2 * l + 1]);
    }
    kernels::hyperparameters hp;
    hp.lr = job.lr;
    kernels::optimizer opt(kernels::optimizer_kind::sgd, {{trained, hp, {}}});

    local_result res;
    order_.assign(job.shard.begin(), job.shard.end());
    const std::size_t n = order_.size(), batch = static_cast<std::size_t>(job.batch);
    batches_.reserve(std::min(batch, n));
    const dataset& train = data_->train;
    const std::int64_t pixels = batches_.pixels();
    double loss = 0;
    for (int e = 0; e < job.epochs; ++e) {
      for (std::size_t i = n; i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
      for (std::size_t b0 = 0; b0 < n; b0 += batch) {
        const std::size_t rows = std::min(batch, n - b0);
        batches_.gather(train, order_.data() + b0, rows);
        const auto m = static_cast<std::int64_t>(rows);
        merge(ab, s);
        base_opt_->zero_grad();
        tensor x = tensor::from<float>(std::span<const float>(batches_.x(), rows * static_cast<std::size_t>(pixels)), {m, pixels});
        tensor labels = tensor::from<std::uint8_t>(std::span<const std::uint8_t>(batches_.y(), rows), {m});
        kernels::saved_activations keep;
        tensor dlogits;
        const double mean = kernels::softmax_cross_entropy(model_->forward(x, keep, true), labels, dlogits);
        model_->backward(dlogits, keep);
        for (std::size_t l = 0; l < L.layers.size(); ++l)
          lora::adapter_gradients(params_[L.layers[l].param]->grad, ab[2 * l].value, ab[2 * l + 1].value, s, ab[2 * l].grad,
                                  ab[2 * l + 1].grad);
        const bool applied = opt.step();
        ++(applied ? res.steps : res.skipped);
        loss += mean * static_cast<double>(rows);
        res.samples += m;
      }
    }
    // The payload: A then B (unscaled) of every layer; base and state stay as they came.
    for (std::size_t l = 0; l < L.layers.size(); ++l) {
      const auto a = std::as_const(ab[2 * l].value).data<float>();
      const auto b = std::as_const(ab[2 * l + 1].value).data<float>();
      float* out = model.data() + L.layers[l].payload_at;
      std::copy(a.begin(), a.end(), out);
      std::copy(b.begin(), b.end(), out + a.size());
    }
    res.loss = res.samples ? loss / static_cast<double>(res.samples) : 0.0;
    return res;
  }

  evaluation evaluate(std::span<const float> model) override {
    const lora_layout& L = *L_;
    net_->load_flat(model.data());
    for (std::size_t l = 0; l < L.layers.size(); ++l) {  // W = W0 + the global change
      const auto& y = L.layers[l];
      tensor& w = params_[y.param]->value;
      if (L.dense_state()) {
        auto v = w.data<float>();
        const float* d = model.data() + y.state_at;
        for (std::size_t i = 0; i < v.size(); ++i) v[i] += d[i];
      } else {
        const lora::adapter g = global_adapter(L, l, model);
        kernels::gemm(tensor::from<float>(std::span<const float>(g.b), {y.shape.out, g.rank}), false,
                      tensor::from<float>(std::span<const float>(g.a), {g.rank, y.shape.in}), false, w, 1.0f, 1.0f);
      }
    }
    return detail::evaluate_test(*net_, batches_, test_limit_);
  }

private:
  /// W = W0 + s B A in every adapted layer.
  void merge(std::vector<kernels::parameter>& ab, float s) {
    for (std::size_t l = 0; l < L_->layers.size(); ++l) {
      tensor& w = params_[L_->layers[l].param]->value;
      std::copy(w0_[l].begin(), w0_[l].end(), w.data<float>().begin());
      kernels::gemm(ab[2 * l + 1].value, false, ab[2 * l].value, false, w, s, 1.0f);
    }
  }

  shared_data data_;
  image_batches batches_;
  std::string spec_, finetune_from_;
  std::shared_ptr<const lora_layout> L_;
  std::unique_ptr<kernels::sequential> model_;
  std::vector<kernels::parameter*> params_;
  std::unique_ptr<kernels::optimizer> base_opt_;
  std::unique_ptr<kernels::classifier> net_;
  std::size_t test_limit_;
  std::vector<std::vector<float>> w0_;
  std::vector<std::uint32_t> order_;
};

/// On the client: only the adapters leave it, as words (4 bytes per float).
class lora_uplink final : public update_transform {
public:
  explicit lora_uplink(std::shared_ptr<const lora_layout> L) : L_(std::move(L)) {}
  std::string name() const override { return "lora"; }
  void apply(client_update& u, std::span<float>, const round_info&, splitmix64&) const override {
    const std::int64_t r = L_->rank_of(u.client);
    u.words.resize(L_->payload_floats(r));
    std::size_t at = 0;
    for (const auto& l : L_->layers) {
      const std::size_t n = static_cast<std::size_t>(r * (l.shape.in + l.shape.out));
      std::memcpy(u.words.data() + at, u.delta.data() + l.payload_at, n * sizeof(float));
      at += n;
    }
    u.delta.clear();
  }

private:
  std::shared_ptr<const lora_layout> L_;
};

/// On the server: the clients' adapters through the rule, as the vector lora_server applies.
class lora_aggregator final : public aggregator {
public:
  explicit lora_aggregator(std::shared_ptr<const lora_layout> L) : L_(std::move(L)) {}
  std::string name() const override { return std::string("lora-") + lora::name_of(L_->rule); }
  void begin(const round_info&) override {
    adapters_.clear();
    weights_.clear();
  }
  void add(std::uint64_t, double, std::span<const float>) override {
    throw std::logic_error("the LoRA aggregator takes the clients' encoded adapters (add_encoded)");
  }
  void add_encoded(std::uint64_t client, double weight, std::span<const std::uint32_t> words) override {
    const lora_layout& L = *L_;
    const std::int64_t r = L.rank_of(client);
    if (words.size() != L.payload_floats(r))
      throw std::invalid_argument("LoRA update of client " + std::to_string(client) + ": " + std::to_string(words.size()) +
                                  " values, not the " + std::to_string(L.payload_floats(r)) + " of rank " + std::to_string(r));
    const float s = static_cast<float>(L.scale(r));
    std::vector<lora::adapter> mine;
    std::size_t at = 0;
    for (const auto& l : L.layers) {
      lora::adapter x{r, std::vector<float>(static_cast<std::size_t>(r * l.shape.in)),
                      std::vector<float>(static_cast<std::size_t>(l.shape.out * r))};
      std::memcpy(x.a.data(), words.data() + at, x.a.size() * sizeof(float));
      std::memcpy(x.b.data(), words.data() + at + x.a.size(), x.b.size() * sizeof(float));
      at += x.a.size() + x.b.size();
      for (float& v : x.b) v *= s;  // the scale folded into B
      mine.push_back(std::move(x));
    }
    adapters_.push_back(std::move(mine));
    weights_.push_back(weight);
  }
  std::vector<float> finish() override {
    if (adapters_.empty()) throw std::logic_error("lora aggregator: finish() with no update");
    const lora_layout& L = *L_;
    std::vector<float> out(L.dim, 0.0f);
    for (std::size_t l = 0; l < L.layers.size(); ++l) {
      const auto& y = L.layers[l];
      std::vector<lora::adapter> layer;
      for (auto& c : adapters_) layer.push_back(std::move(c[l]));
      float* state = out.data() + y.state_at;
      auto put = [&](const lora::adapter& x) {
        std::copy(x.a.begin(), x.a.end(), state);
        std::copy(x.b.begin(), x.b.end(), state + x.a.size());
      };
      switch (L.rule) {
        case lora::rule::fedit: put(lora::mean(layer, weights_, y.shape)); break;
        case lora::rule::fedex: {
          const auto r = lora::fedex(layer, weights_, y.shape);
          put(r.mean);
          for (std::size_t i = 0; i < r.residual.size(); ++i) out[y.weight_at + i] = static_cast<float>(r.residual[i]);
          break;
        }
        case lora::rule::flexlora: {
          const auto d = lora::weighted_product_sum(layer, weights_, y.shape);
          std::transform(d.begin(), d.end(), state, [](double v) { return static_cast<float>(v); });
          break;
        }
        case lora::rule::hetlora: put(lora::hetlora(layer, L.max_rank, y.shape)); break;
      }
    }
    return out;
  }

private:
  std::shared_ptr<const lora_layout> L_;
  std::vector<std::vector<lora::adapter>> adapters_;  // per client, per layer
  std::vector<double> weights_;
};

/// The server's step: base += the aggregate's base (FedEx-LoRA's residual), state = the
/// aggregate's state; the payload stays zero.
class lora_server final : public server_strategy {
public:
  explicit lora_server(std::shared_ptr<const lora_layout> L) : L_(std::move(L)) {}
  std::string name() const override { return "lora"; }
  void apply(std::span<float> global, std::span<const float> aggregate, const round_info&) override {
    for (std::size_t i = 0; i < L_->base; ++i) global[i] += aggregate[i];
    std::copy(aggregate.begin() + static_cast<std::ptrdiff_t>(L_->base),
              aggregate.begin() + static_cast<std::ptrdiff_t>(L_->payload_begin), global.begin() + static_cast<std::ptrdiff_t>(L_->base));
  }

private:
  std::shared_ptr<const lora_layout> L_;
};

}  // namespace

void check_lora_options(const simulation_options& o) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (!o.finetune_from.empty() && o.trainer != "mlp") fail("--finetune-from needs --trainer mlp (noop has no model to load)");
  if (o.lora.empty()) {
    if (o.lora_agg != "fedit") fail("--lora-agg needs --lora R (the adapters' rank)");
    if (o.lora_alpha != 0) fail("--lora-alpha needs --lora R (the adapters' rank)");
    return;
  }
  const auto ranks = lora::parse_ranks(o.lora);
  const auto rule = lora::parse_rule(o.lora_agg);
  if (!(o.lora_alpha >= 0) || !std::isfinite(o.lora_alpha)) fail("--lora-alpha must be a non-negative number (0: the rank)");
  if (o.finetune_from.empty())
    fail("--lora trains adapters on a saved model: give --finetune-from DIR (a `troupe fedsim --checkpoint` directory) or "
         "--finetune-from FILE (`troupe train --save`)");
  if ((rule == lora::rule::fedit || rule == lora::rule::fedex) &&
      std::any_of(ranks.begin(), ranks.end(), [&](std::int64_t r) { return r != ranks.front(); }))
    fail("--lora-agg " + o.lora_agg + " averages A and B, which needs one rank for every client; --lora " + o.lora +
         " mixes ranks (use --lora-agg flexlora or hetlora)");
  const std::string why = " cannot combine with --lora: ";
  if (o.strategy != "fedavg")
    fail("--strategy " + o.strategy + why + "the server's step is --lora-agg's (leave --strategy at fedavg)");
  if (o.server.server_lr >= 0 && o.server.server_lr != 1) fail("--server-lr" + why + "--lora-agg sets the adapters itself");
  if (o.secagg) fail("--secagg" + why + "the LoRA rules need each client's adapters (their products and norms), not their sum");
  if (o.dp_clip != 0 || o.dp_noise != 0) fail("--dp-clip/--dp-noise" + why + "DP-FedAvg is calibrated to whole-model updates");
  if (!o.compress.empty()) fail("--compress" + why + "the clients already send only their adapters");
  if (!o.attack.empty()) fail("--attack" + why + "the attacks act on whole-model updates and data");
  if (!o.async.empty()) fail("--async" + why + "the LoRA rules aggregate synchronous rounds");
  if (o.eval_clients) fail("--eval-clients" + why + "the LoRA trainer measures only the test set");
  if (o.client_optimizer != "sgd") fail("--client-optimizer " + o.client_optimizer + why + "the adapters are stepped by plain SGD");
  if (o.device != "cpu") fail("--device " + o.device + why + "the adapters are trained on the host");
  if (o.trainer != "mlp") fail("--trainer " + o.trainer + why + "the adapters need the mlp trainer's model");
}

trainer_factory make_lora_trainer_factory(const simulation_options& o) {
  auto L = std::make_shared<const lora_layout>(make_layout(o));
  return [o, L](const shared_data& data) -> std::unique_ptr<local_trainer> {
    return std::make_unique<lora_trainer>(data, o, L);
  };
}

void install_lora(simulation& sim, const simulation_options& o) {
  auto L = std::make_shared<const lora_layout>(make_layout(o));
  sim.set_strategy(std::make_unique<lora_server>(L));
  sim.set_aggregator(std::make_unique<lora_aggregator>(L));
  sim.add_transform(std::make_unique<lora_uplink>(L));
}

}  // namespace troupe::federated::detail
