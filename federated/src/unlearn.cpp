// Federated unlearning (unlearn.hpp): the run that trains with everyone, then retraining without
// the removed clients or projected gradient ascent by them, and the membership-inference figures.

#include "troupe/federated/unlearn.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "engine.hpp"
#include "spec.hpp"
#include "troupe/core/file.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/federated/mechanisms.hpp"
#include "troupe/federated/robust.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {

using detail::clock_type;
using detail::since;

unlearn_method parse_unlearn_method(const std::string& spec) {
  unlearn_method m;
  if (spec == "retrain") return m;
  if (spec == "pga" || spec.rfind("pga:", 0) == 0) {
    m.type = unlearn_method::kind::pga;
    if (spec.size() > 3) {
      const std::string k = spec.substr(4);
      int v = -1;
      const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), v);
      if (k.empty() || ec != std::errc() || end != k.data() + k.size() || v < 0 || v > 1000)
        throw std::invalid_argument("--unlearn-method " + spec + ": K (FedAvg rounds after the ascent) must be a whole number from 0 to 1000");
      m.rounds = v;
    }
    return m;
  }
  if (spec == "calibrate" || spec.rfind("calibrate:", 0) == 0) {
    m.type = unlearn_method::kind::calibrate;
    if (spec.size() > 9) {
      const std::string k = spec.substr(10);
      int v = -1;
      const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), v);
      if (k.empty() || ec != std::errc() || end != k.data() + k.size() || v < 1 || v > 1000000)
        throw std::invalid_argument("--unlearn-method " + spec + ": DT (rounds between stored rounds) must be a whole number from 1 to 1000000");
      m.interval = v;
    }
    return m;
  }
  throw std::invalid_argument("--unlearn-method: " + spec + " not in {retrain, pga[:K], calibrate[:DT]}");
}

std::vector<std::uint64_t> unlearn_clients(const simulation_options& o) {
  std::vector<std::uint64_t> out;
  if (o.unlearn == "attackers") {
    if (o.attack.empty()) throw std::invalid_argument("--unlearn attackers removes the clients --attack makes malicious: give --attack");
    for (std::uint64_t c = 0; c < o.clients; ++c)
      if (detail::is_attacker(o, c)) out.push_back(c);
    if (out.empty())
      throw std::invalid_argument("--unlearn attackers: --attack " + o.attack + " makes none of the " +
                                  std::to_string(o.clients) + " clients malicious");
  } else {
    std::size_t at = 0;
    while (at <= o.unlearn.size()) {
      const std::size_t comma = std::min(o.unlearn.find(',', at), o.unlearn.size());
      const std::string id = o.unlearn.substr(at, comma - at);
      std::uint64_t v = 0;
      const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), v);
      if (id.empty() || ec != std::errc() || end != id.data() + id.size())
        throw std::invalid_argument("--unlearn " + o.unlearn + ": '" + id + "' is not a client number (use attackers or ID,ID,...)");
      if (v >= o.clients)
        throw std::invalid_argument("--unlearn: client " + id + " is not in the population of " + std::to_string(o.clients) +
                                    " (clients 0 to " + std::to_string(o.clients - 1) + ")");
      out.push_back(v);
      at = comma + 1;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  if (out.size() >= o.clients)
    throw std::invalid_argument("--unlearn removes all " + std::to_string(o.clients) + " clients: nobody is left to train");
  return out;
}

void check_unlearn_options(const simulation_options& o) {
  auto fail = [](const std::string& why) { throw std::invalid_argument(why); };
  if (o.unlearn.empty()) {
    if (o.unlearn_at != 0) fail("--unlearn-at requires --unlearn");
    if (o.unlearn_method != "retrain") fail("--unlearn-method requires --unlearn");
    return;
  }
  const unlearn_method m = parse_unlearn_method(o.unlearn_method);
  if (o.unlearn_at == 0) fail("--unlearn needs --unlearn-at R: the round after which the clients are removed");
  if (o.unlearn_at < 1 || o.unlearn_at > o.rounds)
    fail("--unlearn-at " + std::to_string(o.unlearn_at) + " must be a round from 1 to --rounds " + std::to_string(o.rounds));
  (void)unlearn_clients(o);
  if (!o.checkpoint.empty())
    fail("--unlearn cannot combine with --checkpoint: the unlearning run does not resume (run the training with "
         "--checkpoint and unlearn in a run of its own)");
  if (detail::parse_async(o.async) > 0)
    fail("--unlearn cannot combine with --async: removing clients from FedBuff's stream of dispatches is not defined here");
  if (!o.contribution.empty()) fail("--unlearn cannot combine with --contribution");
  if (o.verify_norm != 0)
    fail("--unlearn cannot combine with --verify-norm yet: the replayed and ascended updates carry no norm proofs");
  if (!o.excluded.empty()) fail("--unlearn with clients already excluded: name every client to remove in --unlearn");
  if (m.type == unlearn_method::kind::pga) {
    const std::string why = "--unlearn-method " + o.unlearn_method + " ascends the removed clients' loss on the host";
    if (o.trainer != "mlp") fail(why + ": use --trainer mlp");
    if (o.device != "cpu") fail(why + ": use --device cpu");
    if (!o.lora.empty()) fail("--unlearn-method " + o.unlearn_method + " with --lora: the ascent moves the whole model");
    if (!o.drift.empty()) fail("--unlearn-method " + o.unlearn_method + " with --drift: the ascent reads the clients' examples as they were");
  }
  if (m.type == unlearn_method::kind::calibrate) {
    const std::string flag = "--unlearn-method " + o.unlearn_method;
    if (o.strategy != "fedavg")
      fail(flag + " replays FedAvg's rounds (the weighted mean of rescaled updates): use --strategy fedavg, not " + o.strategy);
    if (o.secagg || o.dp_clip != 0 || o.dp_noise != 0 || o.dp_adaptive || !o.compress.empty())
      fail(flag + " stores each client's update as the server receives it: it cannot combine with --secagg, --dp-* or --compress");
    if (o.client_optimizer != "sgd") fail(flag + ": the calibration training uses plain SGD; use --client-optimizer sgd");
    if (!o.lora.empty() || !o.drift.empty()) fail(flag + " cannot combine with --lora or --drift");
    if (o.trainer != "mlp") fail(flag + ": use --trainer mlp");
  }
}

double membership_advantage(std::span<const double> members, std::span<const double> others) {
  if (members.empty() || others.empty()) throw std::invalid_argument("membership_advantage: an empty set of losses");
  // Sweep τ over every loss, ascending: at each distinct value count both sides at or below it.
  std::vector<std::pair<double, int>> all;
  for (double l : members) all.emplace_back(l, 1);
  for (double l : others) all.emplace_back(l, 0);
  std::sort(all.begin(), all.end());
  double best = 0, m = 0, n = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    (all[i].second ? m : n) += 1;
    if (i + 1 < all.size() && all[i + 1].first == all[i].first) continue;
    best = std::max(best, m / static_cast<double>(members.size()) - n / static_cast<double>(others.size()));
  }
  return best;
}

double pga_radius(std::span<const float> reference, std::span<const float> initial) {
  if (reference.size() != initial.size())
    throw std::invalid_argument("pga_radius: the reference has " + std::to_string(reference.size()) +
                                " floats and the initial model " + std::to_string(initial.size()));
  double squares = 0;
  for (std::size_t j = 0; j < reference.size(); ++j)
    squares += (reference[j] - initial[j]) * static_cast<double>(reference[j] - initial[j]);
  return std::sqrt(squares / 3);
}

namespace {

/// A training or test row, and whether it is read as a data attack's malicious client trained
/// on it (stamped with the backdoor and labelled with its target, or its label flipped).
struct example {
  std::uint32_t row = 0;
  bool poisoned = false;
};

/// Rows of a split as the model's inputs.
struct example_reader {
  const labelled_data& data;
  std::size_t pixels;
  bool backdoor = false;
  std::uint8_t target = 0;
  float lut[256];
  example_reader(const labelled_data& d, const simulation_options& o)
      : data(d), pixels(static_cast<std::size_t>(d.train.images.numel() / std::max<std::int64_t>(1, d.train.size()))) {
    for (int v = 0; v < 256; ++v) lut[v] = (static_cast<float>(v) / 255.0f - d.mean) / d.stddev;
    backdoor = o.attack.rfind("backdoor", 0) == 0;
    if (backdoor)
      target = static_cast<std::uint8_t>(detail::spec_number(o.attack.substr(o.attack.rfind(':') + 1), "--attack " + o.attack));
  }
  /// Example `e` of `split` into x (pixels floats); returns its label.
  std::uint8_t read(const dataset& split, example e, float* x) const {
    const std::size_t row = e.row;
    if (split.images.type() == dtype::f32) {
      std::memcpy(x, split.images.data<float>().data() + row * pixels, pixels * sizeof(float));
    } else {
      const std::uint8_t* src = split.images.data<std::uint8_t>().data() + row * pixels;
      if (e.poisoned && backdoor) {
        std::vector<std::uint8_t> copy(src, src + pixels);
        stamp_backdoor(copy, static_cast<int>(split.images.dim(1)));
        for (std::size_t k = 0; k < pixels; ++k) x[k] = lut[copy[k]];
      } else {
        for (std::size_t k = 0; k < pixels; ++k) x[k] = lut[src[k]];
      }
    }
    const std::uint8_t label = split.labels.data<std::uint8_t>()[row];
    if (!e.poisoned) return label;
    return backdoor ? target : flip_label(label, data.classes);
  }
};

/// Client `c`'s training examples as it trains on them.
void client_examples(const simulation_options& o, simulation& sim, std::uint64_t c, std::vector<example>& out) {
  const bool poisoned = is_data_attack(o.attack) && detail::is_attacker(o, c);
  for (auto row : sim.client_rows(c)) out.push_back({row, poisoned});
}

void load_flat(kernels::sequential& net, std::span<const float> w) {
  std::size_t at = 0;
  for (auto* p : net.parameters()) {
    auto v = p->value.data<float>();
    std::copy_n(w.begin() + static_cast<std::ptrdiff_t>(at), v.size(), v.begin());
    at += v.size();
  }
}

void store_flat(kernels::sequential& net, std::span<float> w) {
  std::size_t at = 0;
  for (auto* p : net.parameters()) {
    auto v = std::as_const(p->value).data<float>();
    std::copy(v.begin(), v.end(), w.begin() + static_cast<std::ptrdiff_t>(at));
    at += v.size();
  }
}

/// Per-example cross-entropy of `net` on examples of `split`.
std::vector<double> row_losses(kernels::sequential& net, const example_reader& reader, const dataset& split,
                               std::span<const example> rows) {
  std::vector<double> out;
  const std::size_t chunk = 256, d = reader.pixels;
  for (std::size_t at = 0; at < rows.size(); at += chunk) {
    const std::size_t m = std::min(chunk, rows.size() - at);
    tensor x = tensor::empty({static_cast<std::int64_t>(m), static_cast<std::int64_t>(d)});
    std::vector<std::uint8_t> y(m);
    for (std::size_t i = 0; i < m; ++i) y[i] = reader.read(split, rows[at + i], x.data<float>().data() + i * d);
    kernels::saved_activations keep;
    const tensor logits = net.forward(x, keep, false);
    const auto z = logits.data<float>();
    const std::size_t c = static_cast<std::size_t>(logits.dim(1));
    for (std::size_t i = 0; i < m; ++i) {
      const float* row = z.data() + i * c;
      const float top = *std::max_element(row, row + c);
      double sum = 0;
      for (std::size_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(row[j]) - top);
      out.push_back(std::log(sum) + top - row[y[i]]);
    }
  }
  return out;
}

/// Up to `n` of `rows`, a seeded choice in their order.
std::vector<example> some_rows(std::vector<example> rows, std::size_t n, std::uint64_t seed) {
  splitmix64 g{seed};
  for (std::size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[g.below(i)]);
  if (rows.size() > n) rows.resize(n);
  return rows;
}

/// The membership figures of model `w` (see unlearn.hpp).
struct membership {
  double removed = 0, retained = 0, unseen = 0;
};

membership measure_membership(const simulation_options& o, simulation& sim, std::span<const float> w,
                              const std::vector<std::uint64_t>& removed) {
  const auto& data = *sim.data();
  auto net = detail::make_model(o.model);
  load_flat(*net, w);
  const example_reader reader(data, o);
  std::vector<char> is_removed(o.clients, 0);
  for (auto c : removed) is_removed[c] = 1;
  std::vector<example> gone, kept;
  for (std::uint64_t c = 0; c < o.clients; ++c) client_examples(o, sim, c, is_removed[c] ? gone : kept);
  const std::size_t n = 2000, test = static_cast<std::size_t>(data.test.size());
  std::vector<example> half_a, half_b;
  for (std::uint32_t i = 0; i < test; ++i) (i < test / 2 ? half_a : half_b).push_back({i, false});
  const std::uint64_t seed = derive_seed(o.seed, detail::stream_unlearn);
  const auto base = row_losses(*net, reader, data.test, some_rows(half_a, n, seed + 1));
  membership m;
  if (base.empty()) return m;
  if (!gone.empty()) m.removed = membership_advantage(row_losses(*net, reader, data.train, some_rows(gone, n, seed + 2)), base);
  if (!kept.empty()) m.retained = membership_advantage(row_losses(*net, reader, data.train, some_rows(kept, n, seed + 3)), base);
  if (!half_b.empty()) m.unseen = membership_advantage(row_losses(*net, reader, data.test, some_rows(half_b, n, seed + 4)), base);
  return m;
}

/// The removed clients' projected gradient ascent from `ref` (unlearn.hpp); returns the steps taken.
std::int64_t gradient_ascent(const simulation_options& o, simulation& sim, std::vector<float>& w,
                             std::span<const float> ref, std::span<const float> initial,
                             const std::vector<std::uint64_t>& removed) {
  const auto& data = *sim.data();
  auto net = detail::make_model(o.model);
  const example_reader reader(data, o);
  const double radius = pga_radius(ref, initial);
  w.assign(ref.begin(), ref.end());
  const std::size_t d = reader.pixels;
  const int batch = std::max(1, o.batch);
  tensor x = tensor::empty({batch, static_cast<std::int64_t>(d)});
  tensor y = tensor::empty({batch}, dtype::u8);
  splitmix64 g{derive_seed(o.seed, detail::stream_unlearn)};
  std::int64_t steps = 0;
  load_flat(*net, w);
  for (auto c : removed) {  // each in turn, one local epoch, from where the previous one left the model
    std::vector<example> rows;
    client_examples(o, sim, c, rows);
    for (std::size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[g.below(i)]);
    for (std::size_t at = 0; at < rows.size(); at += static_cast<std::size_t>(batch)) {
      const int m = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(batch), rows.size() - at));
      for (int i = 0; i < m; ++i) {
        y.data<std::uint8_t>()[static_cast<std::size_t>(i)] =
            reader.read(data.train, rows[at + static_cast<std::size_t>(i)], x.data<float>().data() + static_cast<std::size_t>(i) * d);
      }
      const tensor xb = m == batch ? x : x.slice(0, m), yb = m == batch ? y : y.slice(0, m);
      for (auto* p : net->parameters()) std::fill(p->grad.data<float>().begin(), p->grad.data<float>().end(), 0.0f);
      kernels::saved_activations keep;
      const tensor logits = net->forward(xb, keep, true);
      tensor dlogits;
      (void)kernels::softmax_cross_entropy(logits, yb, dlogits);
      (void)net->backward(dlogits, keep);
      // Ascend: w += lr * grad, then back onto the ball around the reference.
      for (auto* p : net->parameters()) {
        auto v = p->value.data<float>();
        const auto gr = std::as_const(p->grad).data<float>();
        for (std::size_t j = 0; j < v.size(); ++j) v[j] += static_cast<float>(o.lr) * gr[j];
      }
      store_flat(*net, w);
      double dist = 0;
      for (std::size_t j = 0; j < w.size(); ++j) dist += (w[j] - ref[j]) * static_cast<double>(w[j] - ref[j]);
      dist = std::sqrt(dist);
      if (dist > radius) {
        const double scale = radius / dist;
        for (std::size_t j = 0; j < w.size(); ++j) w[j] = static_cast<float>(ref[j] + (w[j] - ref[j]) * scale);
        load_flat(*net, w);
      }
      ++steps;
    }
  }
  return steps;
}

bool finite(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

double metric(const evaluation& e, const std::string& name) {
  for (const auto& [n, v] : e.metrics)
    if (n == name) return v;
  return std::nan("");
}

/// Runs `sim` to round `until`, reporting each round as run_simulation does.
struct round_runner {
  const simulation_options& o;
  const std::function<void(const progress&)>& report;
  summary& s;
  clock_type::time_point start = clock_type::now();
  double round_seconds = 0;
  int ran = 0;

  void run(simulation& sim, int until) {
    while (sim.rounds_done() < until) {
      const round_report rr = sim.run_round();
      const int r = sim.rounds_done();
      round_seconds += rr.seconds;
      ++ran;
      if (!finite(sim.global_model()))
        throw std::runtime_error("round " + std::to_string(r) +
                                 " diverged: the model is no longer finite (lower --lr or --server-lr, or check the attack "
                                 "and noise settings)");
      progress p;
      p.round = &rr;
      p.rounds = until;
      if (r % o.eval_every == 0 || r == until) {
        p.evaluated = true;
        p.eval = sim.evaluate();
        s.final_accuracy = p.eval.accuracy;
        s.final_loss = p.eval.loss;
        s.final_metrics = p.eval.metrics;
      }
      p.rounds_per_s = ran / round_seconds;
      p.seconds = since(start);
      p.simulated_seconds = sim.simulated_seconds();
      s.uplink_bytes += rr.uplink_bytes;
      p.uplink_bytes = s.uplink_bytes;
      if (report) report(p);
    }
  }
};

/// FedEraser's store: every update of the rounds 1, 1 + DT, ... up to `last`, as sent.
class update_store final : public update_transform {
public:
  struct stored {
    std::uint64_t client;
    double weight;
    std::vector<float> delta;
  };
  update_store(int interval, int last) : interval_(interval), last_(last) {}
  std::string name() const override { return "federaser-store"; }
  void apply(client_update& u, std::span<float>, const round_info& round, splitmix64&) const override {
    if (round.round > last_ || (round.round - 1) % interval_ != 0 || u.delta.empty()) return;
    std::lock_guard lock(mutex_);
    rounds_[round.round].push_back({u.client, u.weight, u.delta});
  }
  /// The stored rounds in order, each round's updates by client (the order clients finished
  /// in does not matter).
  std::map<int, std::vector<stored>>& rounds() {
    for (auto& [r, updates] : rounds_)
      std::sort(updates.begin(), updates.end(), [](const stored& a, const stored& b) { return a.client < b.client; });
    return rounds_;
  }
  std::uint64_t bytes() const {
    std::uint64_t b = 0;
    for (const auto& [r, updates] : rounds_)
      for (const auto& u : updates) b += 4 * static_cast<std::uint64_t>(u.delta.size());
    return b;
  }

private:
  int interval_, last_;
  mutable std::mutex mutex_;
  mutable std::map<int, std::vector<stored>> rounds_;
};

/// FedEraser's calibration from the initial model (unlearn.hpp); returns the rounds replayed.
int calibrate(const simulation_options& o, simulation& sim, update_store& store, std::vector<float>& w,
              const std::vector<std::uint64_t>& removed) {
  auto trainer = make_trainer_factory(o)(sim.data());
  std::vector<float> model(w.size());
  std::vector<double> sum(w.size());
  int replayed = 0;
  for (auto& [round, updates] : store.rounds()) {
    std::fill(sum.begin(), sum.end(), 0.0);
    double weights = 0;
    for (const auto& u : updates) {
      if (std::binary_search(removed.begin(), removed.end(), u.client) || u.delta.size() != w.size()) continue;
      local_job job;
      job.client = u.client;
      job.global = w;
      job.shard = sim.client_rows(u.client);
      job.batch = o.batch;
      job.lr = o.lr;
      job.round = round;
      const double work = static_cast<double>(job.shard.size()) * std::max(1, o.local_epochs) / 2.0;
      job.steps = o.local_steps > 0 ? std::max(1, o.local_steps / 2)
                                    : std::max(1, static_cast<int>(std::ceil(work / std::max(1, o.batch))));
      std::copy(w.begin(), w.end(), model.begin());
      splitmix64 rng{derive_seed(derive_seed(o.seed, detail::stream_unlearn + 1 + static_cast<std::uint64_t>(round)), u.client)};
      (void)trainer->train(job, model, rng);
      double old_norm = 0, cal_norm = 0;
      for (std::size_t j = 0; j < w.size(); ++j) {
        const double c = static_cast<double>(model[j]) - w[j];
        old_norm += static_cast<double>(u.delta[j]) * u.delta[j];
        cal_norm += c * c;
      }
      if (cal_norm == 0) continue;  // no direction to keep (an empty shard)
      const double scale = std::sqrt(old_norm) / std::sqrt(cal_norm);
      for (std::size_t j = 0; j < w.size(); ++j) sum[j] += u.weight * scale * (static_cast<double>(model[j]) - w[j]);
      weights += u.weight;
    }
    if (weights > 0)
      for (std::size_t j = 0; j < w.size(); ++j) w[j] = static_cast<float>(w[j] + sum[j] / weights);
    ++replayed;
  }
  return replayed;
}

}  // namespace

summary run_unlearning(const simulation_options& o, const std::function<void(const progress&)>& report) {
  check_unlearn_options(o);
  const auto removed = unlearn_clients(o);
  const unlearn_method method = parse_unlearn_method(o.unlearn_method);
  summary s;
  round_runner runner{o, report, s};
  auto sim = std::make_unique<simulation>(o);
  const std::vector<float> initial(sim->global_model().begin(), sim->global_model().end());
  update_store* store = nullptr;
  if (method.type == unlearn_method::kind::calibrate) {
    auto recorder = std::make_unique<update_store>(method.interval, o.unlearn_at);
    store = recorder.get();
    sim->add_transform(std::move(recorder));
  }
  runner.run(*sim, o.unlearn_at);
  const evaluation before = sim->evaluate();
  const membership before_mia =
      sim->data() ? measure_membership(o, *sim, sim->global_model(), removed) : membership{};
  const auto t0 = clock_type::now();
  std::vector<std::pair<std::string, double>> figures;
  int unlearned_at = 0;  // the round whose model is the unlearned one
  if (method.type == unlearn_method::kind::retrain) {
    simulation_options again = o;
    again.unlearn.clear();
    again.unlearn_at = 0;
    again.unlearn_method = "retrain";
    again.excluded = removed;
    sim = std::make_unique<simulation>(again);
    runner.run(*sim, o.unlearn_at);
    figures.emplace_back("unlearn_rounds", o.unlearn_at);
    unlearned_at = o.unlearn_at;
  } else if (method.type == unlearn_method::kind::calibrate) {
    std::vector<float> w = initial;
    const int replayed = calibrate(o, *sim, *store, w, removed);
    sim->set_global_model(w);
    sim->exclude_clients(removed);
    figures.emplace_back("unlearn_rounds", replayed);
    figures.emplace_back("unlearn_storage_bytes", static_cast<double>(store->bytes()));
    unlearned_at = sim->rounds_done();
  } else {
    sim->exclude_clients(removed);
    runner.run(*sim, o.unlearn_at + 1);  // the remaining clients' round: the reference model
    const std::vector<float> ref(sim->global_model().begin(), sim->global_model().end());
    std::vector<float> w;
    const std::int64_t steps = gradient_ascent(o, *sim, w, ref, initial, removed);
    double moved = 0;
    for (std::size_t j = 0; j < w.size(); ++j) moved += (w[j] - ref[j]) * static_cast<double>(w[j] - ref[j]);
    sim->set_global_model(w);
    figures.emplace_back("pga_ascent_steps", static_cast<double>(steps));
    figures.emplace_back("pga_radius", pga_radius(ref, initial));
    figures.emplace_back("pga_distance", std::sqrt(moved));
    runner.run(*sim, o.unlearn_at + 1 + method.rounds);
    figures.emplace_back("unlearn_rounds", method.rounds + 2);
    unlearned_at = sim->rounds_done();
  }
  const double unlearn_seconds = since(t0);
  const evaluation after = sim->evaluate();
  const membership after_mia = sim->data() ? measure_membership(o, *sim, sim->global_model(), removed) : membership{};
  s.final_accuracy = after.accuracy;  // unless the rounds after unlearning evaluate again
  s.final_loss = after.loss;
  s.final_metrics = after.metrics;
  runner.run(*sim, std::max(o.rounds, unlearned_at));
  figures.emplace_back("unlearn_removed_clients", static_cast<double>(removed.size()));
  figures.emplace_back("unlearn_seconds", unlearn_seconds);
  figures.emplace_back("accuracy_before_unlearning", before.accuracy);
  figures.emplace_back("unlearned_accuracy", after.accuracy);
  if (const double b = metric(before, "backdoor_success"); std::isfinite(b)) {
    figures.emplace_back("backdoor_success_before_unlearning", b);
    figures.emplace_back("unlearned_backdoor_success", metric(after, "backdoor_success"));
  }
  if (sim->data()) {
    figures.emplace_back("mia_advantage_removed_before", before_mia.removed);
    figures.emplace_back("mia_advantage_removed", after_mia.removed);
    figures.emplace_back("mia_advantage_retained", after_mia.retained);
    figures.emplace_back("mia_advantage_unseen", after_mia.unseen);
  }
  s.final_metrics.insert(s.final_metrics.end(), figures.begin(), figures.end());
  const auto model = sim->global_model();
  s.model_crc32 = troupe::crc32(std::as_bytes(model));
  s.rounds = sim->rounds_done();
  s.rounds_per_s = runner.round_seconds > 0 ? runner.ran / runner.round_seconds : 0.0;
  s.seconds = since(runner.start);
  s.peak_rss_mb = peak_rss_mb();
  if (sim->clients_with_state() > 0)
    s.state_bytes_per_client = static_cast<double>(sim->client_state_bytes()) / static_cast<double>(sim->clients_with_state());
  return s;
}

}  // namespace troupe::federated
