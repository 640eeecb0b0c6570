#include "zk_bulletproofs.hpp"

#include <sodium.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "zk_group_r255.hpp"
#include "zk_group_sodium.hpp"
#include "zk_random.hpp"

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

// ---- the tests' deterministic randomness -----------------------------------------------------------

namespace {
thread_local scoped_test_randomness* active_stream = nullptr;
}

scoped_test_randomness::scoped_test_randomness(std::uint64_t seed) : seed_(seed), outer_(active_stream) {
  active_stream = this;
}

scoped_test_randomness::~scoped_test_randomness() { active_stream = outer_; }

bool draw_test_randomness(std::array<std::uint8_t, 64>& out) {
  scoped_test_randomness* s = active_stream;
  if (s == nullptr) return false;
  std::uint8_t in[16];
  for (int i = 0; i < 8; ++i) {
    in[i] = static_cast<std::uint8_t>(s->seed_ >> (8 * i));
    in[8 + i] = static_cast<std::uint8_t>(s->counter_ >> (8 * i));
  }
  ++s->counter_;
  crypto_hash_sha512(out.data(), in, sizeof in);
  return true;
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

namespace {

/// How many rounds at a time the inner-product prover delays its folds (zk_bulletproofs.hpp).
template <class G>
std::size_t default_delayed_rounds(std::size_t n) {
  if constexpr (requires { G::fast_msm; }) {
    // Folding a generator costs a double product (about 350 point operations on r255), an MSM
    // about 26 a point. Delaying r folds costs r MSMs over all the generators, then one sum of
    // 2^r of them per folded generator: about 26 r + 50 + 600 / 2^r operations per generator
    // against 400, least at r = 3 or 4 (4 measured the faster at n = 16,384).
    if (G::fast_msm && n >= 64) return 4;
  }
  return 0;
}

}  // namespace

namespace {

/// out[i] = Σ_m c[m] p[i + m n] for i < n: by the policy's msm_columns when it has one (the
/// scalars recoded once), else one MSM each.
template <class G>
void fold_columns(const std::vector<typename G::scalar>& c, const std::vector<typename G::point>& p, std::size_t n,
                  std::vector<typename G::point>& out) {
  if constexpr (requires(std::span<const typename G::scalar> cs, std::span<const typename G::point> ps,
                         std::span<typename G::point> os) { G::msm_columns(cs, ps, n, os); }) {
    G::msm_columns(c, p, n, out);
  } else {
    std::vector<typename G::point> q(c.size());
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t m = 0; m < c.size(); ++m) q[m] = p[i + m * n];
      out[i] = G::msm(c, q);
    }
  }
}

}  // namespace

template <class G>
ipa_proof<G> ipa_prove(transcript& t, std::vector<typename G::point> g, std::vector<typename G::point> h,
                       std::vector<typename G::scalar> h_factor, const typename G::point& U,
                       std::vector<typename G::scalar> a, std::vector<typename G::scalar> b, int delayed) {
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

  // One round: L = <a_lo, g_hi> + <b_hi, h'_lo> + c_L U and R = <a_hi, g_lo> + <b_lo, h'_hi> + c_R U
  // as MSMs over the generators as they stand, each block m < cg.size() of them standing for the
  // folded generators g_i = Σ_m cg[m] g_(i + m n) and h'_i = Σ_m ch[m] f_(i + m n) h_(i + m n) (f
  // the factors) while their folds are delayed; then the challenge, a and b folded.
  auto round = [&](const std::vector<scalar>& cg, const std::vector<scalar>& ch) {
    const std::size_t k = n / 2, blocks = cg.size();
    sc.assign(2 * k * blocks + 1, G::zero());
    pt.assign(2 * k * blocks + 1, G::identity());
    for (int side = 0; side < 2; ++side) {
      const std::size_t a_off = side == 0 ? 0 : k, g_off = side == 0 ? k : 0;
      const std::size_t b_off = side == 0 ? k : 0, h_off = side == 0 ? 0 : k;
      std::size_t at = 0;
      for (std::size_t m = 0; m < blocks; ++m)
        for (std::size_t i = 0; i < k; ++i) {
          sc[at] = blocks == 1 ? a[a_off + i] : G::mul(a[a_off + i], cg[m]);
          pt[at++] = g[g_off + i + m * n];
          const std::size_t o = h_off + i + m * n;
          sc[at] = G::mul(blocks == 1 ? b[b_off + i] : G::mul(b[b_off + i], ch[m]), h_factor[o]);
          pt[at++] = h[o];
        }
      sc[at] = inner<G>(std::span<const scalar>(a).subspan(a_off, k), std::span<const scalar>(b).subspan(b_off, k));
      pt[at] = U;
      const point P = G::msm(sc, pt);
      t.append_point<G>(side == 0 ? "ipa.L" : "ipa.R", P);
      (side == 0 ? proof.L : proof.R).push_back(P);
    }
    const scalar u = t.challenge<G>("ipa.u");
    const scalar u_inv = G::invert(u);
    for (std::size_t i = 0; i < k; ++i) {
      a[i] = G::add(G::mul(u, a[i]), G::mul(u_inv, a[k + i]));
      b[i] = G::add(G::mul(u_inv, b[i]), G::mul(u, b[k + i]));
    }
    a.resize(k);
    b.resize(k);
    n = k;
    return std::pair{u, u_inv};
  };

  const std::vector<scalar> unit{G::one()};
  while (n > 1) {
    const auto left = static_cast<std::size_t>(std::countr_zero(n));
    const std::size_t block = std::min(left, delayed < 0 ? default_delayed_rounds<G>(n) : static_cast<std::size_t>(delayed));
    if (block == 0) {
      // Fold the generators now: g_i = u^-1 g_i + u g_(k+i), h'_i = u h'_i + u^-1 h'_(k+i).
      const auto [u, u_inv] = round(unit, unit);
      const std::size_t k = n;
      if (k > 1)  // the last fold's generators are never used
        for (std::size_t i = 0; i < k; ++i) {
          const scalar gs[2] = {u_inv, u};
          const point gp[2] = {g[i], g[k + i]};
          g[i] = G::msm(gs, gp);
          const scalar hs[2] = {G::mul(u, h_factor[i]), G::mul(u_inv, h_factor[k + i])};
          const point hp[2] = {h[i], h[k + i]};
          h[i] = G::msm(hs, hp);
          h_factor[i] = G::one();
        }
      g.resize(k);
      h.resize(k);
      h_factor.resize(k);
      continue;
    }
    // `block` rounds with the folds delayed: the coefficients of block m double each round,
    // cg[2m] = u^-1 cg[m], cg[2m+1] = u cg[m] (ch with u and u^-1 swapped); then each folded
    // generator is made at once, an MSM of 2^block of the generators.
    std::vector<scalar> cg = unit, ch = unit;
    for (std::size_t j = 0; j < block; ++j) {
      const auto [u, u_inv] = round(cg, ch);
      std::vector<scalar> ng(2 * cg.size()), nh(2 * cg.size());
      for (std::size_t m = 0; m < cg.size(); ++m) {
        ng[2 * m] = G::mul(u_inv, cg[m]);
        ng[2 * m + 1] = G::mul(u, cg[m]);
        nh[2 * m] = G::mul(u, ch[m]);
        nh[2 * m + 1] = G::mul(u_inv, ch[m]);
      }
      cg = std::move(ng);
      ch = std::move(nh);
    }
    if (n == 1) break;  // the last fold's generators are never used
    std::vector<point> fg(n), fh(n);
    fold_columns<G>(cg, g, n, fg);
    // The factors, when geometric across the blocks (f_(i + m n) = f_i f_(m n) / f_0, as the
    // range proof's y^-i are), stay outside the folded h: its sums share their scalars.
    const std::size_t blocks = cg.size();
    bool geometric = !G::is_zero(h_factor[0]);
    const scalar f0_inv = geometric ? G::invert(h_factor[0]) : G::zero();
    std::vector<scalar> ratio(blocks);
    for (std::size_t m = 0; m < blocks && geometric; ++m) {
      ratio[m] = G::mul(h_factor[m * n], f0_inv);
      for (std::size_t i = 0; i < n && geometric; ++i)
        geometric = G::mul(h_factor[i], ratio[m]) == h_factor[i + m * n];
    }
    if (geometric) {
      for (std::size_t m = 0; m < blocks; ++m) ratio[m] = G::mul(ch[m], ratio[m]);
      fold_columns<G>(ratio, h, n, fh);
      h_factor.resize(n);
    } else {
      std::vector<scalar> s(blocks);
      std::vector<point> q(blocks);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t m = 0; m < blocks; ++m) {
          s[m] = G::mul(ch[m], h_factor[i + m * n]);
          q[m] = h[i + m * n];
        }
        fh[i] = G::msm(s, q);
      }
      h_factor.assign(n, G::one());
    }
    g = std::move(fg);
    h = std::move(fh);
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
                                     std::vector<G::scalar>, int);                                             \
  template ipa_coefficients<G> ipa_challenges<G>(transcript&, std::size_t, const ipa_proof<G>&);              \
  template bool ipa_verify<G>(transcript&, std::span<const G::point>, std::span<const G::point>,              \
                              const G::point&, const G::point&, const ipa_proof<G>&);                          \
  template range_proof<G> range_prove<G>(transcript&, std::size_t, std::span<const G::point>, const G::scalar&, \
                                         std::span<const G::scalar>, std::span<const G::scalar>, bool);        \
  template bool range_verify<G>(transcript&, std::size_t, std::span<const G::point>, const G::scalar&,        \
                                const range_proof<G>&);

TROUPE_ZK_INSTANTIATE(sodium_group)
TROUPE_ZK_INSTANTIATE(r255_group)

}  // namespace troupe::federated::zk
