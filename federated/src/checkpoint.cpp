// Checkpoints of a simulation: everything the next rounds depend on, with the options that must
// match, a version and a CRC-32, written atomically; a load checks all of it before anything
// changes.

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "simulation_impl.hpp"
#include "troupe/core/file.hpp"

namespace troupe::federated {

using namespace detail;

namespace {

/// The options a checkpoint must be resumed with, one "name=value" a line (threads, windows,
/// evaluation and the round count may change).
std::string fingerprint(const simulation_options& o) {
  std::ostringstream s;
  s.precision(17);
  s << "clients=" << o.clients << "\nper-round=" << o.per_round << "\nfraction=" << o.fraction
    << "\nmin-per-round=" << o.min_per_round << "\nlocal-epochs=" << o.local_epochs << "\nbatch=" << o.batch
    << "\nlr=" << o.lr << "\nmodel=" << o.model << "\npartition=" << o.partition << "\nstrategy=" << o.strategy
    << "\nserver-lr=" << o.server.server_lr << "\nserver-momentum=" << o.server.momentum << "\nbeta1=" << o.server.beta1
    << "\nbeta2=" << o.server.beta2 << "\ntau=" << o.server.tau << "\nbias-correction=" << o.server.bias_correction
    << "\nseed=" << o.seed << "\ndata-dir=" << o.data_dir << "\ntrainer=" << o.trainer << "\ntrain-limit=" << o.train_limit
    << "\ndropout=" << o.dropout << "\ndeadline=" << o.deadline << "\nover-select=" << o.over_select
    << "\nsample-seconds=" << o.sample_seconds << "\nsecagg=" << o.secagg << "\nsecagg-dropout=" << o.secagg_dropout
    << "\ndp-clip=" << o.dp_clip << "\ndp-noise=" << o.dp_noise << "\ndp-delta=" << o.dp_delta
    << "\ndp-adaptive=" << o.dp_adaptive << "\ncompress=" << o.compress << "\nattack=" << o.attack << "\nlatency=" << o.latency
    << "\nasync=" << o.async << "\n";
  // Lines only a stateful client optimizer adds: checkpoints of other runs keep their fingerprint.
  if (o.client_optimizer != "sgd") s << "client-optimizer=" << o.client_optimizer << "\nclient-state=" << o.client_state << "\n";
  // Likewise for fine-tuning, a shift and LoRA.
  if (!o.finetune_from.empty()) s << "finetune-from=" << o.finetune_from << "\n";
  if (o.eval_clients) s << "eval-clients=1\n";  // the clients train on 80% of their shards
  if (!o.shift.empty()) s << "shift=" << o.shift << "\n";
  if (!o.lora.empty()) s << "lora=" << o.lora << "\nlora-agg=" << o.lora_agg << "\nlora-alpha=" << o.lora_alpha << "\n";
  if (o.local_steps > 0) s << "local-steps=" << o.local_steps << "\n";
  if (!o.excluded.empty()) {  // clients never sampled: another run
    s << "excluded=";
    for (std::size_t i = 0; i < o.excluded.size(); ++i) s << (i ? "," : "") << o.excluded[i];
    s << "\n";
  }
  return s.str();
}

/// The first line where two fingerprints differ, as a sentence.
std::string first_difference(const std::string& saved, const std::string& now) {
  std::istringstream a(saved), b(now);
  std::string x, y;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, x)), more_b = static_cast<bool>(std::getline(b, y));
    if (!more_a && !more_b) return "the options differ";
    if (x != y)
      return "it was saved with " + (more_a ? x : std::string("(nothing)")) + " and this run has " +
             (more_b ? y : std::string("(nothing)"));
  }
}

constexpr char checkpoint_magic[8] = {'T', 'R', 'F', 'E', 'D', 'C', 'K', '\0'};
// 1: synchronous runs only; 2: FedBuff's state after the clients (empty for synchronous runs).
// 3: each client's optimizer state after its own state.
constexpr std::uint32_t checkpoint_version = 3;

std::uint32_t crc32_of(const char* data, std::size_t n) {
  return troupe::crc32(std::as_bytes(std::span<const char>(data, n)));
}

/// Appends values in the host's byte order (a checkpoint resumes on the machine that wrote it).
struct byte_writer {
  std::string bytes;
  template <class T>
  void put(const T& v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <class T>
  void put_array(std::span<const T> v) {
    put<std::uint64_t>(v.size());
    bytes.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
  }
};

struct byte_reader {
  const std::string& bytes;
  std::size_t at = 0, end = 0;
  const std::string& file;
  [[noreturn]] void truncated() const {
    throw std::runtime_error("checkpoint " + file + " is truncated or malformed (at byte " + std::to_string(at) + ")");
  }
  template <class T>
  T get() {
    if (end - at < sizeof(T)) truncated();
    T v;
    std::memcpy(&v, bytes.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
  template <class T>
  std::vector<T> get_array() {
    const auto n = get<std::uint64_t>();
    if (n > (end - at) / sizeof(T)) truncated();
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), bytes.data() + at, n * sizeof(T));  // an empty vector may have no storage
    at += n * sizeof(T);
    return v;
  }
};


}  // namespace

void simulation::save_checkpoint(const std::string& file) const {
  auto& e = impl_->engine;
  if (impl_->contributions)
    throw std::invalid_argument("--contribution: the cumulative values are not saved in checkpoints");
  // A client in flight trains (in wall time) when it is sent out, which advances its generator
  // and persistent state; its update arrives later on the virtual clock. So the checkpoint waits
  // for the clients in flight and holds their finished updates: what they will deliver is then
  // fixed, and their saved state is the one they continue from.
  impl_->settle_flight();
  if (impl_->rounds == 0) size_client_state(e);
  byte_writer w;
  w.bytes.append(checkpoint_magic, sizeof checkpoint_magic);
  w.put(checkpoint_version);
  const std::string options = fingerprint(e.options);
  w.put_array(std::span<const char>(options));
  w.put<std::int64_t>(impl_->rounds);
  w.put<double>(impl_->clock);
  w.put_array(std::span<const float>(*impl_->global));
  const auto strategy = e.strategy->save_state();
  w.put_array(std::span<const double>(strategy));
  w.put<std::uint64_t>(e.transforms.size());
  for (const auto& t : e.transforms) {
    const auto state = t->save_state();
    w.put_array(std::span<const double>(state));
  }
  w.put<std::uint64_t>(impl_->clients.size());
  w.put<std::uint64_t>(e.state_floats);
  // Asked in windows: the clients are idle between rounds, and a window bounds the copies.
  const std::size_t n = impl_->clients.size(), step = std::max<std::size_t>(1, impl_->window);
  for (std::size_t first = 0; first < n; first += step) {
    std::vector<future<client::saved>> replies;
    for (std::size_t c = first; c < std::min(n, first + step); ++c)
      replies.push_back(impl_->clients[c].ask(&client::save, e.state_floats));
    for (auto& f : replies) {
      const client::saved s = f.get();
      w.put(s.rng);
      w.put_array(std::span<const float>(s.state));
      w.put_array(std::span<const std::byte>(s.optimizer));
    }
  }
  // FedBuff: the server version, the dispatch counter (every later draw derives from it) and
  // the clients in flight. Between server steps the buffer is empty: a step is taken at the
  // K-th arrival, before run_round returns.
  w.put<std::int64_t>(impl_->version);
  w.put<std::uint64_t>(impl_->dispatched);
  w.put<std::uint64_t>(impl_->flight.size());
  for (const auto& f : impl_->flight) {
    w.put<double>(f.arrival);
    w.put<std::uint64_t>(f.dispatch);
    w.put<std::uint64_t>(f.client);
    w.put<std::int64_t>(f.version);
    w.put<std::uint8_t>(f.failed ? 1 : 0);
    if (f.failed) continue;
    const client_update& u = *f.done;
    w.put<std::uint64_t>(u.client);
    w.put<double>(u.weight);
    w.put<std::int64_t>(u.samples);
    w.put<double>(u.loss);
    w.put_array(std::span<const float>(u.delta));
    w.put_array(std::span<const std::uint32_t>(u.words));
  }
  w.put(crc32_of(w.bytes.data(), w.bytes.size()));
  try {
    write_file_atomically(file, std::as_bytes(std::span<const char>(w.bytes)));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("writing the checkpoint: ") + e.what());
  }
}

namespace {

/// The checkpoint's bytes, with its magic, CRC-32 and version checked.
std::string read_checked(const std::string& file, std::uint32_t& version_out) {
  std::string bytes;
  {
    try {
      check_regular(file);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("the checkpoint " + file + " " + e.what());
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read the checkpoint " + file);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw std::runtime_error("cannot read the checkpoint " + file);
  }
  if (bytes.size() < sizeof checkpoint_magic + 2 * sizeof(std::uint32_t) ||
      std::memcmp(bytes.data(), checkpoint_magic, sizeof checkpoint_magic) != 0)
    throw std::runtime_error(file + " is not a fedsim checkpoint (or is truncated)");
  std::uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - sizeof stored_crc, sizeof stored_crc);
  if (crc32_of(bytes.data(), bytes.size() - sizeof stored_crc) != stored_crc)
    throw std::runtime_error("checkpoint " + file + " is corrupted or truncated (CRC-32 mismatch)");
  byte_reader r{bytes, sizeof checkpoint_magic, bytes.size() - sizeof stored_crc, file};
  const auto version = r.get<std::uint32_t>();
  if (version < 1 || version > checkpoint_version)
    throw std::runtime_error("checkpoint " + file + " has version " + std::to_string(version) + "; this build reads 1 to " +
                             std::to_string(checkpoint_version));
  version_out = version;
  return bytes;
}

}  // namespace

std::vector<float> detail::read_checkpoint_model(const std::string& file, std::string& options) {
  std::uint32_t version = 0;
  const std::string bytes = read_checked(file, version);
  byte_reader r{bytes, sizeof checkpoint_magic + sizeof version, bytes.size() - sizeof(std::uint32_t), file};
  const auto saved = r.get_array<char>();
  options.assign(saved.begin(), saved.end());
  (void)r.get<std::int64_t>();  // rounds
  (void)r.get<double>();        // clock
  return r.get_array<float>();
}

void simulation::load_checkpoint(const std::string& file) {
  auto& e = impl_->engine;
  std::uint32_t version = 0;
  const std::string bytes = read_checked(file, version);
  byte_reader r{bytes, sizeof checkpoint_magic + sizeof version, bytes.size() - sizeof(std::uint32_t), file};
  if (version < 2 && impl_->buffer)
    throw std::runtime_error("checkpoint " + file + " has version 1, which holds only synchronous runs; this run is FedBuff");
  const auto saved = r.get_array<char>();
  const std::string options = fingerprint(e.options);
  if (std::string(saved.begin(), saved.end()) != options)
    throw std::runtime_error("checkpoint " + file + " belongs to another simulation: " +
                             first_difference(std::string(saved.begin(), saved.end()), options));
  const auto rounds = r.get<std::int64_t>();
  const auto clock = r.get<double>();
  auto global = std::make_shared<std::vector<float>>(r.get_array<float>());
  const auto strategy = r.get_array<double>();
  const auto transforms = r.get<std::uint64_t>();
  if (rounds < 0 || rounds > 0x7FFFFFFF) r.truncated();
  if (global->size() != e.dim)
    throw std::runtime_error("checkpoint " + file + " holds a model of " + std::to_string(global->size()) +
                             " floats; this one has " + std::to_string(e.dim));
  if (transforms != e.transforms.size())
    throw std::runtime_error("checkpoint " + file + " has " + std::to_string(transforms) + " transforms; this simulation has " +
                             std::to_string(e.transforms.size()));
  std::vector<std::vector<double>> transform_state(transforms);
  for (auto& t : transform_state) t = r.get_array<double>();
  size_client_state(e);
  const auto population = r.get<std::uint64_t>(), floats = r.get<std::uint64_t>();
  if (population != impl_->clients.size() || floats != e.state_floats)
    throw std::runtime_error("checkpoint " + file + " has " + std::to_string(population) + " clients with " +
                             std::to_string(floats) + " state floats each; this simulation has " +
                             std::to_string(impl_->clients.size()) + " with " + std::to_string(e.state_floats));
  std::vector<client::saved> clients(population);
  for (auto& c : clients) {
    c.rng = r.get<std::uint64_t>();
    c.state = r.get_array<float>();
    if (!c.state.empty() && c.state.size() != floats) r.truncated();
    if (version >= 3) c.optimizer = r.get_array<std::byte>();
  }
  std::int64_t server_version = 0;
  std::uint64_t dispatched = 0;
  std::vector<impl::in_flight> flight;
  if (version >= 2) {
    auto malformed = [&](const std::string& why) {
      throw std::runtime_error("checkpoint " + file + " is malformed: " + why);
    };
    server_version = r.get<std::int64_t>();
    dispatched = r.get<std::uint64_t>();
    const auto n = r.get<std::uint64_t>();
    const bool started = dispatched > 0;
    if (!impl_->buffer && (server_version != 0 || dispatched != 0 || n != 0)) malformed("FedBuff state in a synchronous run");
    if (impl_->buffer && (server_version != rounds || n != (started ? impl_->keep : 0)))
      malformed("the server version or the clients in flight do not match the rounds");
    const std::size_t update = e.strategy->update_floats(e.dim);
    std::vector<char> seen(population, 0);
    for (std::uint64_t i = 0; i < n; ++i) {
      impl::in_flight f;
      f.arrival = r.get<double>();
      f.dispatch = r.get<std::uint64_t>();
      f.client = r.get<std::uint64_t>();
      f.version = r.get<std::int64_t>();
      const auto failed = r.get<std::uint8_t>();
      if (!std::isfinite(f.arrival) || f.arrival < clock || f.dispatch >= dispatched || f.client >= population ||
          seen[f.client] || f.version < 0 || f.version > server_version || failed > 1)
        malformed("client in flight " + std::to_string(i) + " is inconsistent");
      seen[f.client] = 1;
      f.failed = failed != 0;
      if (!f.failed) {
        client_update u;
        u.client = r.get<std::uint64_t>();
        u.weight = r.get<double>();
        u.samples = r.get<std::int64_t>();
        u.loss = r.get<double>();
        u.delta = r.get_array<float>();
        u.words = r.get_array<std::uint32_t>();
        if (u.client != f.client || u.delta.size() != update || !u.words.empty())
          malformed("the update of client in flight " + std::to_string(i) + " is inconsistent");
        f.done = std::move(u);
      }
      flight.push_back(std::move(f));
    }
  }
  if (r.at != r.end) throw std::runtime_error("checkpoint " + file + " has trailing bytes");
  // Values a run never writes (a crafted or damaged file with a valid CRC): refused here, not
  // found rounds later as a NaN accuracy or an infinite clock.
  {
    auto bad = [&](const std::string& what) {
      throw std::runtime_error("checkpoint " + file + " is malformed: " + what);
    };
    if (!std::isfinite(clock) || clock < 0) bad("the simulated clock is " + std::to_string(clock));
    if (!all_finite(*global)) bad("the model holds a value that is not finite");
    if (!all_finite(strategy)) bad("the strategy's state holds a value that is not finite");
    // (The transforms' state is theirs to check: a privacy accountant may hold an infinite
    // bound for a run with next to no noise.)
    for (std::size_t c = 0; c < clients.size(); ++c) {
      if (!all_finite(clients[c].state)) bad("client " + std::to_string(c) + "'s state holds a value that is not finite");
      if (!clients[c].optimizer.empty() && !e.stateful_optimizer)
        bad("client " + std::to_string(c) + " holds optimizer state, and this run's clients keep none");
      try {
        impl_->server_trainer->check_optimizer_state(clients[c].optimizer);
      } catch (const std::invalid_argument& x) {
        bad("client " + std::to_string(c) + "'s optimizer state: " + x.what());
      }
    }
    for (const auto& f : flight)
      if (f.done && (!all_finite(f.done->delta) || !std::isfinite(f.done->weight) || !std::isfinite(f.done->loss)))
        bad("an update in flight holds a value that is not finite");
    // The strategy's and the transforms' own rules (lengths, ranges), before anything changes.
    try {
      e.strategy->check_state(strategy, e.dim);
      for (std::size_t t = 0; t < transforms; ++t) e.transforms[t]->check_state(transform_state[t]);
    } catch (const std::invalid_argument& x) {
      bad(x.what());
    }
  }

  // Everything parsed and checked: now the state changes. FedBuff's clients still in flight
  // finish first, so that their training cannot touch the state restored below.
  for (auto& f : impl_->flight) {
    if (!f.reply.valid()) continue;
    try {
      e.give_back(std::move(f.reply.get().delta));
    } catch (...) {  // a failed training is superseded by the checkpoint
    }
  }
  impl_->flight.clear();
  e.strategy->load_state(strategy);
  for (std::size_t t = 0; t < transforms; ++t) e.transforms[t]->load_state(transform_state[t]);
  std::vector<future<std::pair<std::ptrdiff_t, std::ptrdiff_t>>> replies;
  replies.reserve(population);
  for (std::size_t c = 0; c < population; ++c)
    replies.push_back(impl_->clients[c].ask(&client::restore, std::move(clients[c]), floats));
  std::ptrdiff_t bytes_now = static_cast<std::ptrdiff_t>(e.state_bytes.load());
  std::ptrdiff_t holders_now = static_cast<std::ptrdiff_t>(e.state_holders.load());
  for (auto& f : replies) {
    const auto [bytes, holders] = f.get();
    bytes_now += bytes;
    holders_now += holders;
  }
  e.state_bytes.store(static_cast<std::size_t>(bytes_now));
  e.state_holders.store(static_cast<std::size_t>(holders_now));
  impl_->global = std::move(global);
  impl_->rounds = static_cast<int>(rounds);
  impl_->clock = clock;
  impl_->version = server_version;
  impl_->dispatched = dispatched;
  impl_->started = dispatched > 0;
  impl_->flight = std::move(flight);
  impl_->busy.assign(impl_->buffer ? population : 0, 0);
  for (const auto& f : impl_->flight) impl_->busy[f.client] = 1;
}

}  // namespace troupe::federated
