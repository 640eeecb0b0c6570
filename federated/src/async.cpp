#include <algorithm>

#include "simulation_impl.hpp"

// FedBuff (Nguyen et al., 2022): buffered asynchronous aggregation on a virtual clock.

namespace troupe::federated {

using namespace detail;

void simulation::impl::dispatch() {
  const std::uint64_t seq = dispatched++;
  splitmix64 pick{derive_seed(engine.options.seed, stream_async + seq)};
  std::uint64_t c = 0;
  do c = pick.below(clients.size());
  while (busy[c]);
  busy[c] = 1;
  const std::uint64_t seed = derive_seed(engine.options.seed, stream_dispatch + seq);
  splitmix64 g{seed};
  const double arrival = clock + work_seconds(engine, c, g);
  if (engine.options.dropout > 0) {
    splitmix64 fault{derive_seed(engine.options.seed, stream_async_fault + seq)};
    if (fault.uniform01() < engine.options.dropout) {
      flight.push_back({arrival, seq, c, version, true, {}, {}});
      return;
    }
  }
  auto ctx = std::make_shared<round_context>();
  ctx->engine = &engine;
  ctx->global = global;
  ctx->info.round = static_cast<int>(seq % 0x7FFFFFFF) + 1;  // seeds the client's transforms
  ctx->info.dim = engine.strategy->update_floats(engine.dim);
  ctx->info.population = clients.size();
  ctx->info.seed = seed;
  std::shared_ptr<const round_context> shared = ctx;
  flight.push_back({arrival, seq, c, version, false, clients[c].ask(&client::train, shared, c), {}});
}

round_report simulation::impl::async_round(int round) {
  auto& e = engine;
  round_report r;
  const double start = clock;
  if (!started) {
    busy.assign(clients.size(), 0);
    for (std::size_t i = 0; i < keep; ++i) dispatch();
    started = true;
  }
  const std::size_t floats = e.strategy->update_floats(e.dim);
  const bool through = custom_aggregator;
  std::vector<double> sum(through ? 0 : floats, 0.0);
  std::vector<client_update> buffered;
  std::vector<std::uint64_t> who;
  double loss = 0, staleness = 0;
  std::int64_t samples = 0;
  while (who.size() < buffer) {
    auto next = std::min_element(flight.begin(), flight.end(), [](const in_flight& a, const in_flight& b) {
      return a.arrival < b.arrival || (a.arrival == b.arrival && a.dispatch < b.dispatch);
    });
    in_flight f = std::move(*next);
    flight.erase(next);
    clock = f.arrival;
    if (f.failed) {  // its slot goes to another client; the buffer still waits for K updates
      busy[f.client] = 0;
      ++r.dropped;
      r.sampled_clients.push_back(f.client);
      dispatch();
      continue;
    }
    client_update u = f.take();
    check_finite(u, "server step " + std::to_string(version + 1));
    if (!hold) busy[f.client] = 0;
    if (!u.words.empty() || u.delta.size() != floats)
      throw std::logic_error("--async: client " + std::to_string(u.client) + " sent an update of another form");
    const std::int64_t s = version - f.version;
    const double w = staleness_weight(s);
    who.push_back(u.client);
    r.sampled_clients.push_back(u.client);
    staleness += static_cast<double>(s);
    loss += u.loss * static_cast<double>(u.samples);
    samples += u.samples;
    r.uplink_bytes += uplink_bytes(u);
    if (through) {
      for (std::size_t i = 0; i < floats; ++i) u.delta[i] = static_cast<float>(w * u.delta[i]);
      buffered.push_back(std::move(u));
    } else {
      for (std::size_t i = 0; i < floats; ++i) sum[i] += w * u.delta[i];
      e.give_back(std::move(u.delta));
    }
    if (who.size() == buffer) {  // the K-th arrival: the server moves before the replacement leaves
      round_info info;
      info.round = round;
      info.dim = floats;
      info.population = clients.size();
      info.participants = who;
      info.seed = derive_seed(e.options.seed, stream_sample + static_cast<std::uint64_t>(round) + (1ull << 31));
      std::vector<float> aggregate(floats);
      if (through) {
        agg->begin(info);
        for (auto& b : buffered) agg->add(b.client, b.weight, b.delta);
        aggregate = agg->finish();
        for (auto& b : buffered) e.give_back(std::move(b.delta));
        buffered.clear();
      } else {
        for (std::size_t i = 0; i < floats; ++i) aggregate[i] = static_cast<float>(sum[i] / static_cast<double>(buffer));
      }
      auto model = std::make_shared<std::vector<float>>(*global);
      e.strategy->apply(*model, aggregate, info);
      global = std::move(model);
      ++version;
      if (hold)
        for (auto c : who) busy[c] = 0;
      for (auto& t : e.transforms) t->end_round(info, r.metrics);
    }
    dispatch();
  }
  r.round = round;
  r.participants = buffer;
  r.sampled = buffer + r.dropped;
  r.simulated_seconds = clock - start;
  r.train_loss = samples ? loss / static_cast<double>(samples) : 0.0;
  r.metrics.emplace_back("mean_staleness", staleness / static_cast<double>(buffer));
  return r;
}

void simulation::impl::settle_flight() {
  for (auto& f : flight)
    if (!f.failed && !f.done) f.done = f.reply.get();
}

}  // namespace troupe::federated
