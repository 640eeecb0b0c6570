#include "zk_bulletproofs.hpp"

#include <sodium.h>

#include <bit>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "zk_group_sodium.hpp"

namespace troupe::federated::zk {

static_assert(sizeof(crypto_hash_sha512_state) <= 256, "the transcript's state buffer is too small");

// ---- transcript ------------------------------------------------------------------------------------

namespace {
crypto_hash_sha512_state* state_of(std::array<std::uint8_t, 256>& s) {
  return reinterpret_cast<crypto_hash_sha512_state*>(s.data());
}
void put_u64(crypto_hash_sha512_state* st, std::uint64_t v) {
  std::uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(v >> (8 * i));
  crypto_hash_sha512_update(st, b, 8);
}
}  // namespace

transcript::transcript(std::string_view protocol) {
  crypto_hash_sha512_init(state_of(state_));
  append("protocol", std::span(reinterpret_cast<const std::uint8_t*>(protocol.data()), protocol.size()));
}

void transcript::append(std::string_view label, std::span<const std::uint8_t> bytes) {
  auto* st = state_of(state_);
  put_u64(st, label.size());
  crypto_hash_sha512_update(st, reinterpret_cast<const unsigned char*>(label.data()), label.size());
  put_u64(st, bytes.size());
  crypto_hash_sha512_update(st, bytes.data(), bytes.size());
}

void transcript::append_u64(std::string_view label, std::uint64_t v) {
  std::uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(v >> (8 * i));
  append(label, b);
}

std::array<std::uint8_t, 64> transcript::challenge_bytes(std::string_view label) {
  static constexpr std::string_view tag = "challenge";
  append(tag, std::span(reinterpret_cast<const std::uint8_t*>(label.data()), label.size()));
  crypto_hash_sha512_state copy;
  std::memcpy(&copy, state_.data(), sizeof copy);
  std::array<std::uint8_t, 64> out;
  crypto_hash_sha512_final(&copy, out.data());
  append("drawn", out);
  return out;
}

// ---- generators ------------------------------------------------------------------------------------

template <class G>
generators<G> generators<G>::get(std::size_t n) {
  using point = typename G::point;
  static std::mutex lock;
  static std::shared_ptr<const std::vector<point>> gs = std::make_shared<std::vector<point>>(),
                                                   hs = std::make_shared<std::vector<point>>();
  static const point H = G::hash_to_point("troupe.zk.H", {});
  static const point B = G::base_mul(G::one());
  std::lock_guard<std::mutex> hold(lock);
  if (gs->size() < n) {
    auto g = std::make_shared<std::vector<point>>(*gs);
    auto h = std::make_shared<std::vector<point>>(*hs);
    const std::size_t want = std::max(n, 2 * gs->size());
    g->reserve(want);
    h->reserve(want);
    for (std::size_t i = gs->size(); i < want; ++i) {
      std::uint8_t index[8];
      for (int k = 0; k < 8; ++k) index[k] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(i) >> (8 * k));
      g->push_back(G::hash_to_point("troupe.zk.g", index));
      h->push_back(G::hash_to_point("troupe.zk.h", index));
    }
    gs = std::move(g);
    hs = std::move(h);
  }
  return {B, H, gs, hs};
}

// ---- inner-product argument ------------------------------------------------------------------------

namespace {

template <class G>
typename G::scalar inner(std::span<const typename G::scalar> a, std::span<const typename G::scalar> b) {
  auto acc = G::zero();
  for (std::size_t i = 0; i < a.size(); ++i) acc = G::add(acc, G::mul(a[i], b[i]));
  return acc;
}

bool power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }

}  // namespace

template <class G>
ipa_proof<G> ipa_prove(transcript& t, std::vector<typename G::point> g, std::vector<typename G::point> h,
                       std::vector<typename G::scalar> h_factor, const typename G::point& U,
                       std::vector<typename G::scalar> a, std::vector<typename G::scalar> b) {
  using scalar = typename G::scalar;
  using point = typename G::point;
  std::size_t n = a.size();
  if (!power_of_two(n) || b.size() != n || g.size() < n || h.size() < n || !(h_factor.empty() || h_factor.size() == n))
    throw std::invalid_argument("inner-product argument: vectors of one power-of-two length are needed");
  g.resize(n);
  h.resize(n);
  if (h_factor.empty()) h_factor.assign(n, G::one());
  t.append_u64("ipa.n", n);
  ipa_proof<G> proof;
  std::vector<scalar> sc;
  std::vector<point> pt;
  while (n > 1) {
    const std::size_t k = n / 2;
    const scalar cL = inner<G>(std::span(a).first(k), std::span(b).subspan(k, k));
    const scalar cR = inner<G>(std::span(a).subspan(k, k), std::span(b).first(k));
    // L = <a_lo, g_hi> + <b_hi, h'_lo> + c_L U;  R = <a_hi, g_lo> + <b_lo, h'_hi> + c_R U.
    sc.assign(2 * k + 1, G::zero());
    pt.assign(2 * k + 1, G::identity());
    for (std::size_t i = 0; i < k; ++i) {
      sc[i] = a[i];
      pt[i] = g[k + i];
      sc[k + i] = G::mul(b[k + i], h_factor[i]);
      pt[k + i] = h[i];
    }
    sc[2 * k] = cL;
    pt[2 * k] = U;
    const point L = G::msm(sc, pt);
    for (std::size_t i = 0; i < k; ++i) {
      sc[i] = a[k + i];
      pt[i] = g[i];
      sc[k + i] = G::mul(b[i], h_factor[k + i]);
      pt[k + i] = h[k + i];
    }
    sc[2 * k] = cR;
    const point R = G::msm(sc, pt);
    t.append_point<G>("ipa.L", L);
    t.append_point<G>("ipa.R", R);
    proof.L.push_back(L);
    proof.R.push_back(R);
    const scalar u = t.challenge<G>("ipa.u");
    const scalar u_inv = G::invert(u);
    for (std::size_t i = 0; i < k; ++i) {
      a[i] = G::add(G::mul(u, a[i]), G::mul(u_inv, a[k + i]));
      b[i] = G::add(G::mul(u_inv, b[i]), G::mul(u, b[k + i]));
      if (k > 1) {  // the last fold's generators are never used
        const scalar gs[2] = {u_inv, u};
        const point gp[2] = {g[i], g[k + i]};
        g[i] = G::msm(gs, gp);
        const scalar hs[2] = {G::mul(u, h_factor[i]), G::mul(u_inv, h_factor[k + i])};
        const point hp[2] = {h[i], h[k + i]};
        h[i] = G::msm(hs, hp);
        h_factor[i] = G::one();
      }
    }
    n = k;
  }
  proof.a = a[0];
  proof.b = b[0];
  return proof;
}

template <class G>
ipa_coefficients<G> ipa_challenges(transcript& t, std::size_t n, const ipa_proof<G>& proof) {
  if (!power_of_two(n)) throw std::invalid_argument("inner-product argument: the length must be a power of two");
  const auto rounds = static_cast<std::size_t>(std::countr_zero(n));
  if (proof.L.size() != rounds || proof.R.size() != rounds)
    throw std::invalid_argument("inner-product argument: " + std::to_string(proof.L.size()) + " rounds where " +
                                std::to_string(rounds) + " are needed");
  t.append_u64("ipa.n", n);
  ipa_coefficients<G> c;
  for (std::size_t j = 0; j < rounds; ++j) {
    t.append_point<G>("ipa.L", proof.L[j]);
    t.append_point<G>("ipa.R", proof.R[j]);
    c.u.push_back(t.challenge<G>("ipa.u"));
    c.u_inv.push_back(G::invert(c.u.back()));
  }
  c.s.resize(n);
  c.s_inv.resize(n);
  c.s[0] = G::one();
  c.s_inv[0] = G::one();
  for (std::size_t j = 0; j < rounds; ++j) {
    c.s[0] = G::mul(c.s[0], c.u_inv[j]);
    c.s_inv[0] = G::mul(c.s_inv[0], c.u[j]);
  }
  for (std::size_t i = 1; i < n; ++i) {
    // The highest set bit of i is split in round j = rounds - 1 - bit: u_j^-1 becomes u_j.
    const auto bit = static_cast<std::size_t>(std::bit_width(i) - 1);
    const std::size_t j = rounds - 1 - bit;
    const auto u2 = G::mul(c.u[j], c.u[j]);
    const auto u2_inv = G::mul(c.u_inv[j], c.u_inv[j]);
    c.s[i] = G::mul(c.s[i - (std::size_t{1} << bit)], u2);
    c.s_inv[i] = G::mul(c.s_inv[i - (std::size_t{1} << bit)], u2_inv);
  }
  return c;
}

template <class G>
bool ipa_verify(transcript& t, std::span<const typename G::point> g, std::span<const typename G::point> h,
                const typename G::point& U, const typename G::point& P, const ipa_proof<G>& proof) {
  const std::size_t n = g.size();
  if (h.size() != n) throw std::invalid_argument("inner-product argument: g and h differ in length");
  const auto c = ipa_challenges<G>(t, n, proof);
  std::vector<typename G::scalar> sc;
  std::vector<typename G::point> pt;
  for (std::size_t i = 0; i < n; ++i) {
    sc.push_back(G::neg(G::mul(proof.a, c.s[i])));
    pt.push_back(g[i]);
    sc.push_back(G::neg(G::mul(proof.b, c.s_inv[i])));
    pt.push_back(h[i]);
  }
  sc.push_back(G::neg(G::mul(proof.a, proof.b)));
  pt.push_back(U);
  sc.push_back(G::one());
  pt.push_back(P);
  for (std::size_t j = 0; j < c.u.size(); ++j) {
    sc.push_back(G::mul(c.u[j], c.u[j]));
    pt.push_back(proof.L[j]);
    sc.push_back(G::mul(c.u_inv[j], c.u_inv[j]));
    pt.push_back(proof.R[j]);
  }
  return G::msm(sc, pt) == G::identity();
}

// ---- range proof -----------------------------------------------------------------------------------

std::size_t range_rounds(std::size_t n, std::size_t m) {
  return static_cast<std::size_t>(std::countr_zero(n * std::bit_ceil(std::max<std::size_t>(m, 1))));
}

namespace {

void check_bits(std::size_t n) {
  if (!power_of_two(n) || n > 64) throw std::invalid_argument("range proof: the bits per value must be a power of two up to 64");
}

/// Appends the statement: n, m, the commitments (the padding is implied by m) and the offset.
template <class G>
void append_statement(transcript& t, std::size_t n, std::span<const typename G::point> V, const typename G::scalar& offset) {
  t.append_u64("range.n", n);
  t.append_u64("range.m", V.size());
  for (const auto& p : V) t.append_point<G>("range.V", p);
  t.append_scalar<G>("range.offset", offset);
}

/// Bit i of a scalar's canonical little-endian encoding.
template <class G>
bool bit_of(const typename G::scalar& s, std::size_t i) {
  const auto b = G::encode(s);
  return (b[i / 8] >> (i % 8)) & 1;
}

template <class G>
bool below_two_to(const typename G::scalar& s, std::size_t n) {
  const auto b = G::encode(s);
  for (std::size_t i = n; i < 256; ++i)
    if ((b[i / 8] >> (i % 8)) & 1) return false;
  return true;
}

template <class G>
std::vector<typename G::scalar> powers(const typename G::scalar& x, std::size_t n) {
  std::vector<typename G::scalar> p(n);
  if (n == 0) return p;
  p[0] = G::one();
  for (std::size_t i = 1; i < n; ++i) p[i] = G::mul(p[i - 1], x);
  return p;
}

}  // namespace

template <class G>
range_proof<G> range_prove(transcript& t, std::size_t n, std::span<const typename G::point> V,
                           const typename G::scalar& offset, std::span<const typename G::scalar> v,
                           std::span<const typename G::scalar> gamma, bool check) {
  using scalar = typename G::scalar;
  using point = typename G::point;
  check_bits(n);
  const std::size_t m = V.size();
  if (m == 0 || v.size() != m || gamma.size() != m)
    throw std::invalid_argument("range proof: as many values and blindings as commitments (at least one) are needed");
  if (check)
    for (std::size_t j = 0; j < m; ++j)
      if (!below_two_to<G>(v[j], n))
        throw std::invalid_argument("range proof: value " + std::to_string(j) + " is not below 2^" + std::to_string(n));
  const std::size_t mp = std::bit_ceil(m), N = n * mp;
  const auto gen = generators<G>::get(N);
  const auto& g = *gen.g;
  const auto& h = *gen.h;
  append_statement<G>(t, n, V, offset);

  // A = α H + <a_L, g> + <a_R, h> with a_L the values' bits and a_R = a_L - 1.
  const scalar alpha = G::random(), rho = G::random();
  std::vector<scalar> sc(2 * N + 1);
  std::vector<point> pt(2 * N + 1);
  std::vector<char> aL(N, 0);
  const scalar minus_one = G::neg(G::one());
  for (std::size_t i = 0; i < N; ++i) {
    const std::size_t j = i / n;
    aL[i] = j < m && bit_of<G>(v[j], i % n);
    sc[i] = aL[i] ? G::one() : G::zero();
    pt[i] = g[i];
    sc[N + i] = aL[i] ? G::zero() : minus_one;
    pt[N + i] = h[i];
  }
  sc[2 * N] = alpha;
  pt[2 * N] = gen.H;
  const point A = G::msm(sc, pt);
  // S = ρ H + <s_L, g> + <s_R, h>.
  std::vector<scalar> sL(N), sR(N);
  for (std::size_t i = 0; i < N; ++i) {
    sL[i] = G::random();
    sR[i] = G::random();
    sc[i] = sL[i];
    sc[N + i] = sR[i];
  }
  sc[2 * N] = rho;
  const point S = G::msm(sc, pt);
  t.append_point<G>("range.A", A);
  t.append_point<G>("range.S", S);
  const scalar y = t.challenge<G>("range.y"), z = t.challenge<G>("range.z");

  // l(X) = (a_L - z) + s_L X;  r(X) = y^i (a_R + z + s_R X) + z^(2+j) 2^(i mod n).
  const auto yp = powers<G>(y, N), zp = powers<G>(z, mp + 2), two = powers<G>(G::from_u64(2), n);
  std::vector<scalar> l0(N), r0(N), r1(N);
  for (std::size_t i = 0; i < N; ++i) {
    const scalar a_l = aL[i] ? G::one() : G::zero(), a_r = aL[i] ? G::zero() : minus_one;
    l0[i] = G::sub(a_l, z);
    r0[i] = G::add(G::mul(yp[i], G::add(a_r, z)), G::mul(zp[2 + i / n], two[i % n]));
    r1[i] = G::mul(yp[i], sR[i]);
  }
  const scalar t1 = G::add(inner<G>(l0, r1), inner<G>(sL, r0));
  const scalar t2 = inner<G>(sL, r1);
  const scalar tau1 = G::random(), tau2 = G::random();
  range_proof<G> proof;
  {
    const scalar s1[2] = {t1, tau1}, s2[2] = {t2, tau2};
    const point bh[2] = {gen.B, gen.H};
    proof.T1 = G::msm(s1, bh);
    proof.T2 = G::msm(s2, bh);
  }
  t.append_point<G>("range.T1", proof.T1);
  t.append_point<G>("range.T2", proof.T2);
  const scalar x = t.challenge<G>("range.x");

  std::vector<scalar> l(N), r(N);
  for (std::size_t i = 0; i < N; ++i) {
    l[i] = G::add(l0[i], G::mul(sL[i], x));
    r[i] = G::add(r0[i], G::mul(r1[i], x));
  }
  proof.A = A;
  proof.S = S;
  proof.t_hat = inner<G>(l, r);
  scalar tau_x = G::add(G::mul(tau2, G::mul(x, x)), G::mul(tau1, x));
  for (std::size_t j = 0; j < m; ++j) tau_x = G::add(tau_x, G::mul(zp[2 + j], gamma[j]));
  proof.tau_x = tau_x;
  proof.mu = G::add(alpha, G::mul(rho, x));
  t.append_scalar<G>("range.tau_x", proof.tau_x);
  t.append_scalar<G>("range.mu", proof.mu);
  t.append_scalar<G>("range.t_hat", proof.t_hat);
  const scalar w = t.challenge<G>("range.w");
  // The argument runs on h'_i = y^-i h_i, given as factors rather than N products.
  const auto y_inv = powers<G>(G::invert(y), N);
  proof.ipa = ipa_prove<G>(t, std::vector<point>(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(N)),
                           std::vector<point>(h.begin(), h.begin() + static_cast<std::ptrdiff_t>(N)), y_inv,
                           G::mul(w, gen.B), std::move(l), std::move(r));
  return proof;
}

template <class G>
bool range_verify(transcript& t, std::size_t n, std::span<const typename G::point> V, const typename G::scalar& offset,
                  const range_proof<G>& proof) {
  using scalar = typename G::scalar;
  using point = typename G::point;
  check_bits(n);
  const std::size_t m = V.size();
  if (m == 0) throw std::invalid_argument("range proof: no commitments");
  const std::size_t mp = std::bit_ceil(m), N = n * mp;
  if (proof.ipa.L.size() != range_rounds(n, m))
    throw std::invalid_argument("range proof: " + std::to_string(proof.ipa.L.size()) + " rounds where " +
                                std::to_string(range_rounds(n, m)) + " are needed");
  const auto gen = generators<G>::get(N);
  append_statement<G>(t, n, V, offset);
  t.append_point<G>("range.A", proof.A);
  t.append_point<G>("range.S", proof.S);
  const scalar y = t.challenge<G>("range.y"), z = t.challenge<G>("range.z");
  t.append_point<G>("range.T1", proof.T1);
  t.append_point<G>("range.T2", proof.T2);
  const scalar x = t.challenge<G>("range.x");
  t.append_scalar<G>("range.tau_x", proof.tau_x);
  t.append_scalar<G>("range.mu", proof.mu);
  t.append_scalar<G>("range.t_hat", proof.t_hat);
  const scalar w = t.challenge<G>("range.w");
  const auto c = ipa_challenges<G>(t, N, proof.ipa);

  const auto zp = powers<G>(z, mp + 3), two = powers<G>(G::from_u64(2), n);
  const scalar y_inv = G::invert(y);
  // δ(y, z) = (z - z²) Σ_{i<N} y^i - Σ_j z^(3+j) (2^n - 1).
  scalar sum_y = G::zero(), yi = G::one();
  for (std::size_t i = 0; i < N; ++i) {
    sum_y = G::add(sum_y, yi);
    yi = G::mul(yi, y);
  }
  scalar sum_two = G::zero();
  for (const auto& p : two) sum_two = G::add(sum_two, p);
  scalar delta = G::mul(G::sub(z, zp[2]), sum_y);
  for (std::size_t j = 0; j < mp; ++j) delta = G::sub(delta, G::mul(zp[3 + j], sum_two));
  // c weighs the first relation against the argument's equation (the verifier's own randomness).
  const scalar cw = G::random();
  const scalar ab = G::mul(proof.ipa.a, proof.ipa.b);
  scalar offset_weight = G::zero();
  for (std::size_t j = 0; j < m; ++j) offset_weight = G::add(offset_weight, zp[2 + j]);

  std::vector<scalar> sc;
  std::vector<point> pt;
  sc.reserve(2 * N + 2 * c.u.size() + m + 8);
  pt.reserve(sc.capacity());
  // B: w (t̂ - ab) + c (δ + offset Σ z^(2+j) - t̂);  H: -μ - c τ_x.
  sc.push_back(G::add(G::mul(w, G::sub(proof.t_hat, ab)),
                      G::mul(cw, G::sub(G::add(delta, G::mul(offset, offset_weight)), proof.t_hat))));
  pt.push_back(gen.B);
  sc.push_back(G::neg(G::add(proof.mu, G::mul(cw, proof.tau_x))));
  pt.push_back(gen.H);
  // g_i: -z - a s_i;  h_i: z + y^-i (z^(2+j) 2^(i mod n) - b s_i^-1).
  scalar yinv_i = G::one();
  for (std::size_t i = 0; i < N; ++i) {
    sc.push_back(G::neg(G::add(z, G::mul(proof.ipa.a, c.s[i]))));
    pt.push_back((*gen.g)[i]);
    const scalar inner_h = G::sub(G::mul(zp[2 + i / n], two[i % n]), G::mul(proof.ipa.b, c.s_inv[i]));
    sc.push_back(G::add(z, G::mul(yinv_i, inner_h)));
    pt.push_back((*gen.h)[i]);
    yinv_i = G::mul(yinv_i, y_inv);
  }
  sc.push_back(G::one());
  pt.push_back(proof.A);
  sc.push_back(x);
  pt.push_back(proof.S);
  for (std::size_t j = 0; j < c.u.size(); ++j) {
    sc.push_back(G::mul(c.u[j], c.u[j]));
    pt.push_back(proof.ipa.L[j]);
    sc.push_back(G::mul(c.u_inv[j], c.u_inv[j]));
    pt.push_back(proof.ipa.R[j]);
  }
  for (std::size_t j = 0; j < m; ++j) {
    sc.push_back(G::mul(cw, zp[2 + j]));
    pt.push_back(V[j]);
  }
  sc.push_back(G::mul(cw, x));
  pt.push_back(proof.T1);
  sc.push_back(G::mul(cw, G::mul(x, x)));
  pt.push_back(proof.T2);
  return G::msm(sc, pt) == G::identity();
}

// ---- instantiations --------------------------------------------------------------------------------

#define TROUPE_ZK_INSTANTIATE(G)                                                                               \
  template struct generators<G>;                                                                               \
  template ipa_proof<G> ipa_prove<G>(transcript&, std::vector<G::point>, std::vector<G::point>,               \
                                     std::vector<G::scalar>, const G::point&, std::vector<G::scalar>,          \
                                     std::vector<G::scalar>);                                                  \
  template ipa_coefficients<G> ipa_challenges<G>(transcript&, std::size_t, const ipa_proof<G>&);              \
  template bool ipa_verify<G>(transcript&, std::span<const G::point>, std::span<const G::point>,              \
                              const G::point&, const G::point&, const ipa_proof<G>&);                          \
  template range_proof<G> range_prove<G>(transcript&, std::size_t, std::span<const G::point>, const G::scalar&, \
                                         std::span<const G::scalar>, std::span<const G::scalar>, bool);        \
  template bool range_verify<G>(transcript&, std::size_t, std::span<const G::point>, const G::scalar&,        \
                                const range_proof<G>&);

TROUPE_ZK_INSTANTIATE(sodium_group)

}  // namespace troupe::federated::zk
