// The sealed update's plaintext (encode, decode) and the densification of sparse updates, plain
// and oblivious; --tee swtpm's qualifying data over a batch of nonces.

#include "tee_payload.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::federated::tee {
namespace {

template <class T>
void put(bytes& b, T v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}

class reader {
public:
  explicit reader(std::span<const std::uint8_t> d) : d_(d) {}
  template <class T>
  T get(const char* what) {
    if (d_.size() - at_ < sizeof(T)) throw std::invalid_argument(std::string("tee update: truncated at ") + what);
    T v;
    std::memcpy(&v, d_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  template <class T>
  void get_array(std::vector<T>& out, std::size_t n, const char* what) {
    if ((d_.size() - at_) / sizeof(T) < n) throw std::invalid_argument(std::string("tee update: truncated in ") + what);
    out.resize(n);
    if (n > 0) std::memcpy(out.data(), d_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
  }
  bool done() const noexcept { return at_ == d_.size(); }
  std::size_t left() const noexcept { return d_.size() - at_; }

private:
  std::span<const std::uint8_t> d_;
  std::size_t at_ = 0;
};

constexpr std::uint32_t magic = 0x31454554;  // "TEE1"
constexpr std::uint32_t padding = 0xFFFFFFFFu;

}  // namespace

std::array<std::uint8_t, 36> payload_head(const update_payload& p, std::uint32_t n) {
  bytes b;
  b.reserve(36);
  put(b, magic);
  put(b, p.round);
  put(b, p.client);
  put(b, p.weight);
  put(b, p.dim);
  put(b, static_cast<std::uint32_t>(p.sparse ? 1 : 0));
  put(b, n);
  std::array<std::uint8_t, 36> out{};
  std::copy(b.begin(), b.end(), out.begin());
  return out;
}

bytes encode_payload(const update_payload& p) {
  bytes b;
  b.reserve(36 + p.index.size() * 4 + p.value.size() * 4);
  const auto head = payload_head(p, static_cast<std::uint32_t>(p.value.size()));
  b.insert(b.end(), head.begin(), head.end());
  if (p.sparse) {
    const auto* i = reinterpret_cast<const std::uint8_t*>(p.index.data());
    b.insert(b.end(), i, i + p.index.size() * 4);
  }
  const auto* v = reinterpret_cast<const std::uint8_t*>(p.value.data());
  b.insert(b.end(), v, v + p.value.size() * 4);
  return b;
}

payload_view decode_payload_view(std::span<const std::uint8_t> plain) {
  if (reinterpret_cast<std::uintptr_t>(plain.data()) % alignof(float) != 0)
    throw std::invalid_argument("tee update: the payload's bytes are not aligned to 4");
  reader r(plain);
  if (r.get<std::uint32_t>("the magic") != magic) throw std::invalid_argument("tee update: not a TEE1 payload");
  payload_view p;
  p.round = r.get<std::uint32_t>("the round");
  p.client = r.get<std::uint64_t>("the client");
  p.weight = r.get<double>("the weight");
  p.dim = r.get<std::uint32_t>("the dimension");
  const auto kind = r.get<std::uint32_t>("the kind");
  if (kind > 1) throw std::invalid_argument("tee update: kind " + std::to_string(kind) + " is neither dense (0) nor sparse (1)");
  p.sparse = kind == 1;
  const auto n = r.get<std::uint32_t>("the count");
  if (!p.sparse && n != p.dim)
    throw std::invalid_argument("tee update: a dense update of " + std::to_string(n) + " floats for dimension " + std::to_string(p.dim));
  const std::size_t at = plain.size() - r.left();  // 36: the head's length, a multiple of 4
  const std::size_t need = (p.sparse ? 2 : 1) * std::size_t{n} * 4;
  if (r.left() < need) throw std::invalid_argument(std::string("tee update: truncated in ") + (p.sparse ? "the positions" : "the values"));
  if (r.left() > need) throw std::invalid_argument("tee update: bytes after the values");
  // The caller's bytes seen as the words they hold (aligned, checked above).
  const std::uint8_t* body = plain.data() + at;
  if (p.sparse) {
    p.index = {reinterpret_cast<const std::uint32_t*>(body), n};
    body += std::size_t{n} * 4;
  }
  p.value = {reinterpret_cast<const float*>(body), n};
  return p;
}

update_payload decode_payload(std::span<const std::uint8_t> plain) {
  // Copied first: a payload at any address decodes (the view needs 4-byte alignment).
  std::vector<std::uint32_t> aligned((plain.size() + 3) / 4);
  if (!plain.empty()) std::memcpy(aligned.data(), plain.data(), plain.size());
  const auto v = decode_payload_view({reinterpret_cast<const std::uint8_t*>(aligned.data()), plain.size()});
  update_payload p;
  p.round = v.round;
  p.client = v.client;
  p.weight = v.weight;
  p.dim = v.dim;
  p.sparse = v.sparse;
  p.index.assign(v.index.begin(), v.index.end());
  p.value.assign(v.value.begin(), v.value.end());
  return p;
}

std::array<std::uint8_t, 32> nonce_list_digest(const std::vector<bytes>& nonces) {
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  for (const auto& n : nonces) crypto_hash_sha256_update(&st, n.data(), n.size());
  std::array<std::uint8_t, 32> out{};
  crypto_hash_sha256_final(&st, out.data());
  return out;
}

bytes round_statement(std::uint32_t round, std::uint64_t dim, double noise_stddev, double divisor, bool oblivious,
                      const std::vector<bytes>& nonces) {
  static const char label[] = "troupe tee round v1";
  bytes b;
  b.reserve(sizeof label - 1 + 4 + 8 + 8 + 8 + 1 + 32);
  b.insert(b.end(), label, label + sizeof label - 1);
  put(b, round);
  put(b, dim);
  put(b, noise_stddev);
  put(b, divisor);
  put(b, static_cast<std::uint8_t>(oblivious ? 1 : 0));
  const auto list = nonce_list_digest(nonces);
  b.insert(b.end(), list.begin(), list.end());
  return b;
}

std::array<std::uint8_t, 32> statement_digest(std::span<const std::uint8_t> statement) {
  std::array<std::uint8_t, 32> out{};
  crypto_hash_sha256(out.data(), statement.data(), statement.size());
  return out;
}

std::array<std::uint8_t, 32> batch_qualifying(std::span<const std::uint8_t> enclave_key, const std::vector<bytes>& nonces) {
  const auto list = nonce_list_digest(nonces);
  std::array<std::uint8_t, 32> out{};
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  crypto_hash_sha256_update(&st, enclave_key.data(), enclave_key.size());
  crypto_hash_sha256_update(&st, list.data(), list.size());
  crypto_hash_sha256_final(&st, out.data());
  return out;
}

void densify(std::span<const std::uint32_t> index, std::span<const float> value, std::span<float> out, bool oblivious,
             access_trace* trace) {
  if (index.size() != value.size())
    throw std::invalid_argument("densify: " + std::to_string(index.size()) + " positions for " + std::to_string(value.size()) + " values");
  const std::size_t d = out.size();
  if (index.size() > d)  // more entries than coordinates: only a hostile payload, and O(n d) to densify obliviously
    throw std::invalid_argument("densify: " + std::to_string(index.size()) + " entries for an update of " + std::to_string(d));
  for (auto i : index)
    if (i != padding && i >= d)
      throw std::invalid_argument("densify: position " + std::to_string(i) + " is outside the update's " + std::to_string(d));
  std::fill(out.begin(), out.end(), 0.0f);
  if (trace)
    for (std::size_t i = 0; i < d; ++i) trace->push_back(static_cast<std::uint32_t>(i));
  if (!oblivious) {
    for (std::size_t j = 0; j < index.size(); ++j) {
      if (index[j] == padding) continue;
      out[index[j]] = value[j];
      if (trace) trace->push_back(index[j]);
    }
    return;
  }
  // Every entry passes over every coordinate; a mask (all ones where the position matches)
  // selects its value there, with no branch and no address that depends on the position.
  std::vector<std::uint32_t> bits(value.size());
  if (!value.empty()) std::memcpy(bits.data(), value.data(), value.size() * sizeof(float));
  auto* o = reinterpret_cast<std::uint32_t*>(out.data());
  for (std::size_t j = 0; j < index.size(); ++j) {
    const std::uint32_t at = index[j], v = bits[j];
    for (std::size_t i = 0; i < d; ++i) {
      const std::uint32_t mask = 0u - static_cast<std::uint32_t>(static_cast<std::uint32_t>(i) == at);
      o[i] = (o[i] & ~mask) | (v & mask);
    }
    if (trace)
      for (std::size_t i = 0; i < d; ++i) trace->push_back(static_cast<std::uint32_t>(i));
  }
}

}  // namespace troupe::federated::tee
