// The norm proof (zkproof.hpp): its prover and verifier over a group policy, its byte encoding,
// and the public functions on either backend.

#include "zk_norm.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "zk_group_r255.hpp"
#include "zk_group_sodium.hpp"

namespace troupe::federated::zk {

namespace {

constexpr std::uint8_t magic[4] = {'T', 'Z', 'K', 'N'};
constexpr std::uint8_t version = 1;
constexpr std::size_t header_bytes = 12;
constexpr std::size_t max_dim = std::size_t{1} << 24;

std::size_t bits_of(const norm_params& p) { return static_cast<std::size_t>(p.bits); }

/// B_q² (below 2^62 for k <= 32).
std::uint64_t bound_squared(const norm_params& p) {
  const auto b = static_cast<std::uint64_t>(bound_quanta(p));
  return b * b;
}

/// Appends the statement and the commitments: the start of every transcript of a norm proof.
template <class G>
transcript open_transcript(const norm_params& p, const norm_proof<G>& proof) {
  transcript t("troupe.zk.norm.v1");
  t.append_u64("dim", p.dim);
  t.append_u64("bits", bits_of(p));
  t.append_u64("bound_squared", bound_squared(p));
  for (const auto& c : proof.C) t.append_point<G>("C", c);
  for (const auto& c : proof.C2) t.append_point<G>("C2", c);
  return t;
}

/// V = B_q² B - Σ C2_i: a commitment to B_q² - Σ x_i² with blinding -Σ (x_i r_i + s_i).
template <class G>
typename G::point norm_commitment(const norm_params& p, const std::vector<typename G::point>& C2) {
  auto v = G::base_mul(G::from_u64(bound_squared(p)));
  for (const auto& c : C2) v = G::sub(v, c);
  return v;
}

template <class G>
void append_opened(transcript& t, std::span<const std::int64_t> opened) {
  std::vector<std::uint8_t> bytes(8 * opened.size());
  for (std::size_t i = 0; i < opened.size(); ++i)
    for (int k = 0; k < 8; ++k) bytes[8 * i + k] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(opened[i]) >> (8 * k));
  t.append("opened", bytes);
}

}  // namespace

template <class G>
norm_proof<G> prove(const norm_params& p, std::span<const typename G::scalar> x, std::span<const std::int64_t> opened,
                    bool check) {
  using scalar = typename G::scalar;
  using point = typename G::point;
  check_params(p);
  const std::size_t d = p.dim, k = bits_of(p);
  if (x.size() != d || opened.size() != d)
    throw std::invalid_argument("norm proof: " + std::to_string(d) + " coordinates expected, got " + std::to_string(x.size()));
  const auto gen = generators<G>::get(1);
  norm_proof<G> proof;
  std::vector<scalar> r(d), s(d);
  proof.C.resize(d);
  proof.C2.resize(d);
  for (std::size_t i = 0; i < d; ++i) {
    r[i] = G::random();
    s[i] = G::random();
    const scalar cs[2] = {x[i], r[i]};
    const point cp[2] = {gen.B, gen.H};
    proof.C[i] = G::msm(cs, cp);
    // C2 = x C + s H, computed on B and H (whose tables a backend may keep): x² B + (x r + s) H.
    const scalar qs[2] = {G::mul(x[i], x[i]), G::add(G::mul(x[i], r[i]), s[i])};
    proof.C2[i] = G::msm(qs, cp);
  }
  transcript t = open_transcript<G>(p, proof);

  // The squares' Σ-protocol.
  auto& sq = proof.squares;
  std::vector<scalar> a(d), b(d), c(d);
  sq.T1.resize(d);
  sq.T2.resize(d);
  for (std::size_t i = 0; i < d; ++i) {
    a[i] = G::random();
    b[i] = G::random();
    c[i] = G::random();
    // T2 = a C + c H = (a x) B + (a r + c) H, on B and H as above.
    const scalar s1[2] = {a[i], b[i]}, s2[2] = {G::mul(a[i], x[i]), G::add(G::mul(a[i], r[i]), c[i])};
    const point bh[2] = {gen.B, gen.H};
    sq.T1[i] = G::msm(s1, bh);
    sq.T2[i] = G::msm(s2, bh);
    t.append_point<G>("sq.T1", sq.T1[i]);
    t.append_point<G>("sq.T2", sq.T2[i]);
  }
  const scalar e = t.challenge<G>("sq.e");
  sq.z1.resize(d);
  sq.z2.resize(d);
  sq.z3.resize(d);
  for (std::size_t i = 0; i < d; ++i) {
    sq.z1[i] = G::add(a[i], G::mul(e, x[i]));
    sq.z2[i] = G::add(b[i], G::mul(e, r[i]));
    sq.z3[i] = G::add(c[i], G::mul(e, s[i]));
    t.append_scalar<G>("sq.z1", sq.z1[i]);
    t.append_scalar<G>("sq.z2", sq.z2[i]);
    t.append_scalar<G>("sq.z3", sq.z3[i]);
  }

  // Every coordinate in range: x_i + 2^(k-1) ∈ [0, 2^k) on C_i + 2^(k-1) B.
  const scalar half = G::from_u64(std::uint64_t{1} << (k - 1));
  std::vector<scalar> shifted(d);
  for (std::size_t i = 0; i < d; ++i) shifted[i] = G::add(x[i], half);
  proof.coordinates = range_prove<G>(t, k, proof.C, half, shifted, r, check);

  // The norm: B_q² - Σ x_i² ∈ [0, 2^(2k)).
  scalar sum = G::zero(), blind = G::zero();
  for (std::size_t i = 0; i < d; ++i) {
    sum = G::add(sum, G::mul(x[i], x[i]));
    blind = G::add(blind, G::add(G::mul(x[i], r[i]), s[i]));
  }
  const point V[1] = {norm_commitment<G>(p, proof.C2)};
  const scalar value[1] = {G::sub(G::from_u64(bound_squared(p)), sum)}, gamma[1] = {G::neg(blind)};
  proof.norm = range_prove<G>(t, 2 * k, V, G::zero(), value, gamma, check);

  // The opening: Σ ρ^i (C_i - x_i B) = (Σ ρ^i r_i) H, proved by a Schnorr proof on H.
  append_opened<G>(t, opened);
  const scalar rho = t.challenge<G>("open.rho");
  scalar weight = G::one(), tr = G::zero();
  for (std::size_t i = 0; i < d; ++i) {
    tr = G::add(tr, G::mul(weight, r[i]));
    weight = G::mul(weight, rho);
  }
  const scalar nonce = G::random();
  proof.K = G::mul(nonce, gen.H);
  t.append_point<G>("open.K", proof.K);
  const scalar e2 = t.challenge<G>("open.e");
  proof.z = G::add(nonce, G::mul(e2, tr));
  return proof;
}

template <class G>
std::string verify(const norm_params& p, const norm_proof<G>& proof, std::span<const std::int64_t> opened) {
  using scalar = typename G::scalar;
  using point = typename G::point;
  check_params(p);
  const std::size_t d = p.dim, k = bits_of(p);
  const auto& sq = proof.squares;
  if (proof.C.size() != d || proof.C2.size() != d || sq.T1.size() != d || sq.T2.size() != d || sq.z1.size() != d ||
      sq.z2.size() != d || sq.z3.size() != d)
    throw std::invalid_argument("norm proof: the parts do not have " + std::to_string(d) + " entries each");
  if (!opened.empty() && opened.size() != d)
    throw std::invalid_argument("norm proof: " + std::to_string(opened.size()) + " opened values for " + std::to_string(d) +
                                " commitments");
  const auto gen = generators<G>::get(1);
  transcript t = open_transcript<G>(p, proof);
  for (std::size_t i = 0; i < d; ++i) {
    t.append_point<G>("sq.T1", sq.T1[i]);
    t.append_point<G>("sq.T2", sq.T2[i]);
  }
  const scalar e = t.challenge<G>("sq.e");
  for (std::size_t i = 0; i < d; ++i) {
    t.append_scalar<G>("sq.z1", sq.z1[i]);
    t.append_scalar<G>("sq.z2", sq.z2[i]);
    t.append_scalar<G>("sq.z3", sq.z3[i]);
  }
  {  // both equations of every i, weighted by the verifier's random ρ_i and ρ'_i, in one sum
    std::vector<scalar> sc;
    std::vector<point> pt;
    sc.reserve(4 * d + 2);
    pt.reserve(4 * d + 2);
    scalar at_B = G::zero(), at_H = G::zero();
    for (std::size_t i = 0; i < d; ++i) {
      const scalar w1 = G::random(), w2 = G::random();
      at_B = G::add(at_B, G::mul(w1, sq.z1[i]));
      at_H = G::add(at_H, G::add(G::mul(w1, sq.z2[i]), G::mul(w2, sq.z3[i])));
      sc.push_back(G::neg(w1));
      pt.push_back(sq.T1[i]);
      sc.push_back(G::neg(w2));
      pt.push_back(sq.T2[i]);
      sc.push_back(G::sub(G::mul(w2, sq.z1[i]), G::mul(w1, e)));
      pt.push_back(proof.C[i]);
      sc.push_back(G::neg(G::mul(w2, e)));
      pt.push_back(proof.C2[i]);
    }
    sc.push_back(at_B);
    pt.push_back(gen.B);
    sc.push_back(at_H);
    pt.push_back(gen.H);
    if (G::msm(sc, pt) != G::identity()) return "the squares' proof fails (C2 is not a commitment to the square of C's value)";
  }
  const scalar half = G::from_u64(std::uint64_t{1} << (k - 1));
  if (!range_verify<G>(t, k, proof.C, half, proof.coordinates))
    return "the coordinates' range proof fails (a coordinate is outside [-2^" + std::to_string(k - 1) + ", 2^" +
           std::to_string(k - 1) + "))";
  const point V[1] = {norm_commitment<G>(p, proof.C2)};
  if (!range_verify<G>(t, 2 * k, V, G::zero(), proof.norm)) return "the norm's range proof fails (the norm exceeds the bound)";
  if (opened.empty()) return "";
  append_opened<G>(t, opened);
  const scalar rho = t.challenge<G>("open.rho");
  t.append_point<G>("open.K", proof.K);
  const scalar e2 = t.challenge<G>("open.e");
  // z H - K - e' Σ ρ^i C_i + e' (Σ ρ^i x_i) B = 0.
  std::vector<scalar> sc;
  std::vector<point> pt;
  scalar weight = G::one(), sum = G::zero();
  for (std::size_t i = 0; i < d; ++i) {
    sc.push_back(G::neg(G::mul(e2, weight)));
    pt.push_back(proof.C[i]);
    sum = G::add(sum, G::mul(weight, G::from_i64(opened[i])));
    weight = G::mul(weight, rho);
  }
  sc.push_back(G::mul(e2, sum));
  pt.push_back(gen.B);
  sc.push_back(proof.z);
  pt.push_back(gen.H);
  sc.push_back(G::neg(G::one()));
  pt.push_back(proof.K);
  if (G::msm(sc, pt) != G::identity()) return "the commitments do not open to the update (the opening proof fails)";
  return "";
}

// ---- encoding --------------------------------------------------------------------------------------

namespace {

std::size_t coordinate_rounds(const norm_params& p) { return range_rounds(bits_of(p), p.dim); }
std::size_t norm_rounds(const norm_params& p) { return range_rounds(2 * bits_of(p), 1); }

template <class G>
struct writer {
  std::vector<std::uint8_t> out;
  void put(const bytes32& b) { out.insert(out.end(), b.begin(), b.end()); }
  void point(const typename G::point& x) { put(G::encode(x)); }
  void scalar(const typename G::scalar& x) { put(G::encode(x)); }
  void points(const std::vector<typename G::point>& v) {
    for (const auto& x : v) point(x);
  }
  void scalars(const std::vector<typename G::scalar>& v) {
    for (const auto& x : v) scalar(x);
  }
  void range(const range_proof<G>& r) {
    point(r.A);
    point(r.S);
    point(r.T1);
    point(r.T2);
    scalar(r.tau_x);
    scalar(r.mu);
    scalar(r.t_hat);
    points(r.ipa.L);
    points(r.ipa.R);
    scalar(r.ipa.a);
    scalar(r.ipa.b);
  }
};

template <class G>
struct reader {
  std::span<const std::uint8_t> in;
  std::size_t at = 0;
  bytes32 take() {
    bytes32 b;
    std::memcpy(b.data(), in.data() + at, 32);
    at += 32;
    return b;
  }
  typename G::point point(const char* what, std::size_t i) {
    typename G::point x;
    const std::size_t where = at;
    if (!G::decode_point(take(), x))
      throw std::invalid_argument(std::string("norm proof: ") + what + "[" + std::to_string(i) + "] at byte " +
                                  std::to_string(where) + " is not a canonical ristretto255 point");
    return x;
  }
  typename G::scalar scalar(const char* what, std::size_t i) {
    typename G::scalar x;
    const std::size_t where = at;
    if (!G::decode_scalar(take(), x))
      throw std::invalid_argument(std::string("norm proof: ") + what + "[" + std::to_string(i) + "] at byte " +
                                  std::to_string(where) + " is not a canonical scalar (below the group order)");
    return x;
  }
  std::vector<typename G::point> points(const char* what, std::size_t n) {
    std::vector<typename G::point> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = point(what, i);
    return v;
  }
  std::vector<typename G::scalar> scalars(const char* what, std::size_t n) {
    std::vector<typename G::scalar> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = scalar(what, i);
    return v;
  }
  range_proof<G> range(const char* which, std::size_t rounds) {
    const std::string w = which;
    range_proof<G> r;
    r.A = point((w + ".A").c_str(), 0);
    r.S = point((w + ".S").c_str(), 0);
    r.T1 = point((w + ".T1").c_str(), 0);
    r.T2 = point((w + ".T2").c_str(), 0);
    r.tau_x = scalar((w + ".tau_x").c_str(), 0);
    r.mu = scalar((w + ".mu").c_str(), 0);
    r.t_hat = scalar((w + ".t_hat").c_str(), 0);
    r.ipa.L = points((w + ".L").c_str(), rounds);
    r.ipa.R = points((w + ".R").c_str(), rounds);
    r.ipa.a = scalar((w + ".a").c_str(), 0);
    r.ipa.b = scalar((w + ".b").c_str(), 0);
    return r;
  }
};

}  // namespace

template <class G>
std::vector<std::uint8_t> encode(const norm_params& p, const norm_proof<G>& proof) {
  writer<G> w;
  w.out.reserve(proof_bytes(p));
  w.out.insert(w.out.end(), magic, magic + 4);
  w.out.push_back(version);
  w.out.push_back(static_cast<std::uint8_t>(p.bits));
  w.out.push_back(0);
  w.out.push_back(0);
  for (int i = 0; i < 4; ++i) w.out.push_back(static_cast<std::uint8_t>(p.dim >> (8 * i)));
  w.points(proof.C);
  w.points(proof.C2);
  w.points(proof.squares.T1);
  w.points(proof.squares.T2);
  w.scalars(proof.squares.z1);
  w.scalars(proof.squares.z2);
  w.scalars(proof.squares.z3);
  w.range(proof.coordinates);
  w.range(proof.norm);
  w.point(proof.K);
  w.scalar(proof.z);
  return std::move(w.out);
}

template <class G>
norm_proof<G> decode(const norm_params& p, std::span<const std::uint8_t> bytes) {
  check_params(p);
  if (bytes.size() < header_bytes)
    throw std::invalid_argument("norm proof: " + std::to_string(bytes.size()) + " bytes, shorter than the 12-byte header");
  if (std::memcmp(bytes.data(), magic, 4) != 0) throw std::invalid_argument("norm proof: the magic is not \"TZKN\"");
  if (bytes[4] != version)
    throw std::invalid_argument("norm proof: version " + std::to_string(bytes[4]) + ", this verifier reads version 1");
  if (bytes[5] != p.bits)
    throw std::invalid_argument("norm proof: " + std::to_string(bytes[5]) + " bits per coordinate, the verifier expects " +
                                std::to_string(p.bits));
  if (bytes[6] != 0 || bytes[7] != 0) throw std::invalid_argument("norm proof: the reserved header bytes are not zero");
  std::uint64_t dim = 0;
  for (int i = 0; i < 4; ++i) dim |= static_cast<std::uint64_t>(bytes[8 + i]) << (8 * i);
  if (dim != p.dim)
    throw std::invalid_argument("norm proof: for " + std::to_string(dim) + " coordinates, the verifier expects " +
                                std::to_string(p.dim));
  if (bytes.size() != proof_bytes(p))
    throw std::invalid_argument("norm proof: " + std::to_string(bytes.size()) + " bytes, a proof for d = " +
                                std::to_string(p.dim) + " and k = " + std::to_string(p.bits) + " has " +
                                std::to_string(proof_bytes(p)));
  reader<G> r{bytes, header_bytes};
  const std::size_t d = p.dim;
  norm_proof<G> proof;
  proof.C = r.points("C", d);
  proof.C2 = r.points("C2", d);
  proof.squares.T1 = r.points("T1", d);
  proof.squares.T2 = r.points("T2", d);
  proof.squares.z1 = r.scalars("z1", d);
  proof.squares.z2 = r.scalars("z2", d);
  proof.squares.z3 = r.scalars("z3", d);
  proof.coordinates = r.range("coordinates", coordinate_rounds(p));
  proof.norm = r.range("norm", norm_rounds(p));
  proof.K = r.point("K", 0);
  proof.z = r.scalar("z", 0);
  return proof;
}

// ---- the public functions --------------------------------------------------------------------

void check_params(const norm_params& p) {
  if (p.dim < 1 || p.dim > max_dim)
    throw std::invalid_argument("norm proof: the dimension must be 1 to 2^24, got " + std::to_string(p.dim));
  if (p.bits != 8 && p.bits != 16 && p.bits != 32)
    throw std::invalid_argument("norm proof: the bits per coordinate must be 8, 16 or 32, got " + std::to_string(p.bits));
  if (!(p.bound > 0) || !std::isfinite(p.bound))
    throw std::invalid_argument("norm proof: the bound must be positive and finite, got " + std::to_string(p.bound));
}

std::int64_t bound_quanta(const norm_params& p) { return (std::int64_t{1} << (p.bits - 1)) - 1; }

double quantum(const norm_params& p) { return p.bound / static_cast<double>(bound_quanta(p)); }

std::vector<std::int64_t> quantize(std::span<const float> update, const norm_params& p) {
  check_params(p);
  if (update.size() != p.dim)
    throw std::invalid_argument("quantize: " + std::to_string(update.size()) + " values for dimension " + std::to_string(p.dim));
  const double q = quantum(p), most = 4611686018427387904.0;  // 2^62
  std::vector<std::int64_t> x(update.size());
  for (std::size_t i = 0; i < update.size(); ++i) {
    if (!std::isfinite(update[i])) throw std::invalid_argument("quantize: value " + std::to_string(i) + " is not finite");
    const double v = std::trunc(static_cast<double>(update[i]) / q);
    x[i] = static_cast<std::int64_t>(std::clamp(v, -most, most));
  }
  return x;
}

std::string_view backend_name(group_backend b) { return b == group_backend::sodium ? "sodium" : "r255"; }

group_backend parse_backend(std::string_view name) {
  if (name == "r255" || name == "fast") return group_backend::fast;
  if (name == "sodium") return group_backend::sodium;
  throw std::invalid_argument("unknown ristretto255 backend '" + std::string(name) + "' (r255 or sodium)");
}

namespace {

/// Runs f.template operator()<G>() for the backend's group policy.
template <class F>
decltype(auto) on_backend(group_backend b, F&& f) {
  if (b == group_backend::sodium) return f.template operator()<sodium_group>();
  return f.template operator()<r255_group>();
}

}  // namespace

void prepare(const norm_params& p, group_backend backend) {
  check_params(p);
  on_backend(backend, [&]<class G>() { (void)generators<G>::get(bits_of(p) * std::bit_ceil(p.dim)); });
}

double product_us(group_backend backend, int count) {
  if (count < 1) throw std::invalid_argument("product_us: count must be at least 1");
  return on_backend(backend, [&]<class G>() {
    auto s = G::random();
    auto point = generators<G>::get(1).H;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < count; ++i) point = G::mul(s, point);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (point == G::identity()) throw std::runtime_error("product_us: the identity (impossible for a non-zero scalar)");
    return us / count;
  });
}

std::size_t proof_bytes(const norm_params& p) {
  check_params(p);
  return header_bytes + 32 * (7 * p.dim + 2 * 9 + 2 * (coordinate_rounds(p) + norm_rounds(p)) + 2);
}

namespace {

template <class G>
std::vector<std::uint8_t> prove_public(std::span<const std::int64_t> x, const norm_params& p, bool check) {
  check_params(p);
  if (x.size() != p.dim)
    throw std::invalid_argument("norm proof: " + std::to_string(x.size()) + " coordinates for dimension " + std::to_string(p.dim));
  if (check) {
    const std::int64_t half = std::int64_t{1} << (p.bits - 1);
    // Each square is below 2^62 and the sum is compared before it could pass 2^63.
    std::uint64_t sum = 0;
    bool over = false;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (x[i] < -half || x[i] >= half)
        throw std::invalid_argument("norm proof: coordinate " + std::to_string(i) + " is " + std::to_string(x[i]) +
                                    " quanta, outside [-2^" + std::to_string(p.bits - 1) + ", 2^" +
                                    std::to_string(p.bits - 1) + ")");
      if (!over) {
        sum += static_cast<std::uint64_t>(x[i] * x[i]);
        over = sum > bound_squared(p);
      }
    }
    if (over)
      throw std::invalid_argument("norm proof: the update's norm is above the bound (its squared norm exceeds " +
                                  std::to_string(bound_squared(p)) + " quanta²)");
  }
  std::vector<typename G::scalar> xs(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xs[i] = G::from_i64(x[i]);
  return encode<G>(p, prove<G>(p, xs, x, check));
}

}  // namespace

std::vector<std::uint8_t> prove_norm(std::span<const std::int64_t> x, const norm_params& p, group_backend backend) {
  return on_backend(backend, [&]<class G>() { return prove_public<G>(x, p, true); });
}

std::vector<std::uint8_t> forge_norm(std::span<const std::int64_t> x, const norm_params& p, group_backend backend) {
  return on_backend(backend, [&]<class G>() { return prove_public<G>(x, p, false); });
}

void check_proof_encoding(std::span<const std::uint8_t> proof, const norm_params& p) { (void)decode<r255_group>(p, proof); }

verdict verify_norm(std::span<const std::uint8_t> proof, const norm_params& p, std::span<const std::int64_t> opened,
                    group_backend backend) {
  return on_backend(backend, [&]<class G>() -> verdict {
    norm_proof<G> decoded;
    try {
      decoded = decode<G>(p, proof);
    } catch (const std::invalid_argument& e) {
      return {false, e.what()};
    }
    auto why = verify<G>(p, decoded, opened);
    return {why.empty(), std::move(why)};
  });
}

// ---- instantiations --------------------------------------------------------------------------------

#define TROUPE_ZK_NORM_INSTANTIATE(G)                                                                                  \
  template norm_proof<G> prove<G>(const norm_params&, std::span<const G::scalar>, std::span<const std::int64_t>, bool); \
  template std::string verify<G>(const norm_params&, const norm_proof<G>&, std::span<const std::int64_t>);             \
  template std::vector<std::uint8_t> encode<G>(const norm_params&, const norm_proof<G>&);                               \
  template norm_proof<G> decode<G>(const norm_params&, std::span<const std::uint8_t>);

TROUPE_ZK_NORM_INSTANTIATE(sodium_group)
TROUPE_ZK_NORM_INSTANTIATE(r255_group)

}  // namespace troupe::federated::zk
