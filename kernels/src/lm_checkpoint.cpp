// The manifest of a language model's sharded checkpoint (lm_checkpoint.hpp).
//
// A text file, one "key=value" a line: the first line names the format ("troupe checkpoint 1"),
// the last is "crc=" and the CRC-32 of every byte before it. Between them: the step, the
// training losses since the last evaluation, the data generator's state, the layout (ranks,
// the rank of each stage, each stage's parameter tensors), the slot and one "shard=" line per
// rank (name, CRC-32, bytes), and "option " lines, the options the run must be resumed with.

#include "lm_checkpoint.hpp"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "troupe/core/file.hpp"

namespace troupe::kernels::detail {
namespace {

constexpr const char* header = "troupe checkpoint 1";

std::uint32_t crc_of(std::string_view s) { return crc32(std::as_bytes(std::span<const char>(s.data(), s.size()))); }

std::string hex(std::uint32_t v) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", v);
  return s;
}

/// A double as C's hexadecimal form: read back to the bit.
std::string exact(double v) {
  char s[64];
  std::snprintf(s, sizeof s, "%a", v);
  return s;
}

template <class T>
std::string joined(const std::vector<T>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

/// A count as the manifest writes it: decimal digits only (no sign, no spaces), that fit in 64
/// bits; nullopt otherwise.
std::optional<std::int64_t> count_of(std::string_view v) {
  std::int64_t n = 0;
  if (v.empty() || v.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size()) return std::nullopt;
  return n;
}

}  // namespace

std::string lm_fingerprint(const lm_options& o, const text_corpus& corpus) {
  std::string tokens;
  for (const auto* part : {&corpus.train, &corpus.validation})
    tokens.append(reinterpret_cast<const char*>(part->data()), part->size() * sizeof(std::int32_t));
  std::ostringstream s;
  s.precision(17);
  s << "model=" << o.model << "\ncorpus=" << (o.text.empty() ? o.dataset : "text")
    << "\ncorpus-characters=" << corpus.train.size() + corpus.validation.size() << "\ncorpus-crc=" << hex(crc_of(tokens))
    << "\nvocab=" << corpus.vocab.size() << "\nsteps=" << o.steps << "\nbatch=" << o.batch
    << "\nmicrobatches=" << o.microbatches << "\nlr=" << o.lr << "\nmin-lr=" << (o.min_lr < 0 ? o.lr / 10 : o.min_lr)
    << "\nwarmup=" << o.warmup << "\nweight-decay=" << o.weight_decay << "\nclip=" << o.clip << "\nstate=" << o.state
    << "\nseed=" << o.seed << "\n";
  return s.str();
}

std::string manifest_path(const std::string& dir) { return (std::filesystem::path(dir) / "manifest").string(); }

void write_manifest(const std::string& dir, const lm_manifest& m) {
  std::ostringstream s;
  s << header << "\nstep=" << m.step << "\nskipped-steps=" << m.skipped_steps << "\ntrain-loss-sum=" << exact(m.loss_sum)
    << "\ntrain-losses=" << m.losses << "\ndata-rng=" << m.data_rng << "\nranks=" << m.ranks
    << "\nplace=" << joined(m.layout.rank_of_stage) << "\ncut=" << joined(m.layout.stage_tensors) << "\nslot=" << m.slot
    << "\n";
  for (const auto& sh : m.shards) s << "shard=" << sh.file << " " << hex(sh.crc) << " " << sh.bytes << "\n";
  std::istringstream options(m.options);
  for (std::string line; std::getline(options, line);) s << "option " << line << "\n";
  std::string text = s.str();
  text += "crc=" + hex(crc_of(text)) + "\n";
  const std::string path = manifest_path(dir);
  try {
    write_file_atomically(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot write the checkpoint manifest " + path + ": " + e.what());
  }
}

lm_manifest read_manifest(const std::string& dir) {
  const std::string path = manifest_path(dir);
  auto bad = [&](const std::string& why) -> std::runtime_error {
    return std::runtime_error("the checkpoint manifest " + path + " " + why);
  };
  if (!std::filesystem::is_directory(dir))
    throw std::runtime_error("--resume " + dir + ": no such directory (a --checkpoint directory of an earlier run)");
  try {
    check_regular(path);
  } catch (const std::runtime_error& e) {
    throw bad(e.what());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("--resume " + dir + ": holds no checkpoint (no manifest)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.rfind(std::string(header) + "\n", 0) != 0) throw bad("is not a troupe checkpoint manifest of this version");
  const auto crc_at = text.rfind("crc=");
  if (crc_at == std::string::npos || text.back() != '\n' || text.size() - crc_at != 4 + 8 + 1 ||
      (crc_at > 0 && text[crc_at - 1] != '\n'))
    throw bad("is truncated (no crc= line at its end)");
  if (text.substr(crc_at + 4, 8) != hex(crc_of(std::string_view(text).substr(0, crc_at))))
    throw bad("is corrupted (its CRC-32 does not match)");
  lm_manifest m;
  std::map<std::string, std::string> fields;
  std::istringstream lines(text.substr(0, crc_at));
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    if (line.rfind("option ", 0) == 0) {
      m.options += line.substr(7) + "\n";
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos) throw bad("has a line without '=': " + line);
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "shard") {
      std::istringstream f(value);
      shard_info s;
      std::string crc;
      std::string rest;
      const bool read = static_cast<bool>(f >> s.file >> crc >> s.bytes) && !(f >> rest);
      const auto parsed = std::from_chars(crc.data(), crc.data() + crc.size(), s.crc, 16);
      if (!read || crc.size() != 8 || parsed.ec != std::errc() || parsed.ptr != crc.data() + crc.size())
        throw bad("has a malformed shard line: " + line);
      m.shards.push_back(s);
    } else if (!fields.emplace(key, value).second) {
      throw bad("has two " + key + "= lines");
    }
  }
  auto field = [&](const char* key) -> const std::string& {
    const auto it = fields.find(key);
    if (it == fields.end()) throw bad(std::string("lacks its ") + key + "= line");
    return it->second;
  };
  auto integer = [&](const char* key) {
    const std::string& v = field(key);
    const auto n = count_of(v);
    if (!n) throw bad(std::string("has ") + key + "=" + v + ", not a count");
    return *n;
  };
  auto list = [&](const char* key) {
    std::vector<std::int64_t> out;
    std::istringstream f(field(key));
    for (std::string item; std::getline(f, item, ',');) {
      const auto n = count_of(item);
      if (!n) throw bad(std::string("has a malformed ") + key + "= line");
      out.push_back(*n);
    }
    return out;
  };
  m.step = integer("step");
  m.skipped_steps = integer("skipped-steps");
  m.losses = integer("train-losses");
  {
    const std::string& v = field("train-loss-sum");
    char* end = nullptr;
    m.loss_sum = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size()) throw bad("has train-loss-sum=" + v + ", not a number");
  }
  m.data_rng = field("data-rng");
  if (const auto ranks = integer("ranks"); ranks < 1 || ranks > std::numeric_limits<int>::max())
    throw bad("has ranks=" + std::to_string(ranks) + " (1 to " + std::to_string(std::numeric_limits<int>::max()) + ")");
  else
    m.ranks = static_cast<int>(ranks);
  for (auto r : list("place")) {
    if (r >= m.ranks) throw bad("has place=" + field("place") + ": a stage on rank " + std::to_string(r) + " of " +
                                std::to_string(m.ranks));
    m.layout.rank_of_stage.push_back(static_cast<int>(r));
  }
  for (auto n : list("cut")) m.layout.stage_tensors.push_back(static_cast<std::size_t>(n));
  m.slot = field("slot");
  if (m.slot != "a" && m.slot != "b") throw bad("has slot=" + m.slot + " (a or b)");
  if (static_cast<int>(m.shards.size()) != m.ranks)
    throw bad("names " + std::to_string(m.shards.size()) + " shards for " + std::to_string(m.ranks) + " ranks");
  for (int r = 0; r < m.ranks; ++r)
    if (m.shards[static_cast<std::size_t>(r)].file != shard_name(r, m.slot))
      throw bad("names the shard " + m.shards[static_cast<std::size_t>(r)].file + " for rank " + std::to_string(r) +
                " (not " + shard_name(r, m.slot) + ")");
  return m;
}

void check_resumable(const lm_manifest& m, const std::string& options, const shard_layout& layout, const std::string& dir) {
  const std::string from = "cannot resume from " + dir + ": ";
  {
    std::istringstream a(m.options), b(options);
    std::string x, y;
    while (true) {
      const bool more_a = static_cast<bool>(std::getline(a, x)), more_b = static_cast<bool>(std::getline(b, y));
      if (!more_a && !more_b) break;
      if (x != y)
        throw std::invalid_argument(from + "it was saved with " + (more_a ? x : std::string("(nothing)")) +
                                    " and this run has " + (more_b ? y : std::string("(nothing)")));
    }
  }
  int ranks = 0;
  for (int r : layout.rank_of_stage) ranks = std::max(ranks, r + 1);
  if (ranks != m.ranks)
    throw std::invalid_argument(from + "it was written by " + std::to_string(m.ranks) + " rank" + (m.ranks == 1 ? "" : "s") +
                                " and this run has " + std::to_string(ranks) + " (resume with --ranks " +
                                std::to_string(m.ranks) + (m.ranks == 1 ? ", or without --pipeline" : "") + ")");
  if (layout.rank_of_stage != m.layout.rank_of_stage)
    throw std::invalid_argument(from + "its " + std::to_string(m.layout.rank_of_stage.size()) +
                                " stages were on ranks " + joined(m.layout.rank_of_stage) + ", this run puts its " +
                                std::to_string(layout.rank_of_stage.size()) + " on ranks " +
                                joined(layout.rank_of_stage) + " (a schedule with the same stages per rank resumes it)");
  if (layout.stage_tensors != m.layout.stage_tensors)
    throw std::invalid_argument(from + "the model was cut into stages of " + joined(m.layout.stage_tensors) +
                                " parameter tensors, this run cuts it into " + joined(layout.stage_tensors));
}

}  // namespace troupe::kernels::detail
