// Private set intersection (ECDH-PSI on ristretto255): the output against the true intersection,
// what the transcript carries, the peer's malformed messages, and the time for 100,000 IDs.

#include <gtest/gtest.h>

#include <sodium.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <ctime>
#include <thread>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support.hpp"
#include "troupe/federated/psi.hpp"

namespace troupe::federated {
namespace {

using test_support::expect_error;

/// Two sets of distinct random IDs with exactly `common` in both, and their intersection.
struct two_sets {
  std::vector<std::uint64_t> a, b, common;
};
two_sets make_sets(std::size_t only_a, std::size_t only_b, std::size_t common, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::set<std::uint64_t> seen;
  auto fresh = [&] {
    for (;;)
      if (auto v = g(); seen.insert(v).second) return v;
  };
  two_sets s;
  for (std::size_t i = 0; i < common; ++i) s.common.push_back(fresh());
  s.a = s.common;
  s.b = s.common;
  for (std::size_t i = 0; i < only_a; ++i) s.a.push_back(fresh());
  for (std::size_t i = 0; i < only_b; ++i) s.b.push_back(fresh());
  std::shuffle(s.a.begin(), s.a.end(), g);
  std::shuffle(s.b.begin(), s.b.end(), g);
  std::sort(s.common.begin(), s.common.end());
  return s;
}

struct transcript {
  std::vector<std::byte> a1, b1, a2, b2;
  std::vector<std::uint64_t> at_a, at_b;
  std::size_t a_learns_size = 0, b_learns_size = 0;
};
transcript run_both(const std::vector<std::uint64_t>& a_ids, const std::vector<std::uint64_t>& b_ids) {
  psi_party a(a_ids, 2), b(b_ids, 2);
  transcript t;
  t.a1 = a.blinded_ids();
  t.b1 = b.blinded_ids();
  t.a2 = a.blind_peer(t.b1);
  t.b2 = b.blind_peer(t.a1);
  t.at_a = a.intersect(t.b2);
  t.at_b = b.intersect(t.a2);
  t.a_learns_size = a.peer_size();
  t.b_learns_size = b.peer_size();
  return t;
}

TEST(Ristretto, BlindingsCommuteAsDiffieHellmanNeeds) {
  // a(bP) = b(aP): what lets the two parties' doubly blinded elements meet.
  const std::byte id[8] = {std::byte{1}, std::byte{2}};
  const auto p = ristretto::hash_to_element("troupe/psi/v1", id);
  const auto a = ristretto::random_scalar(), b = ristretto::random_scalar();
  EXPECT_EQ(ristretto::multiply(a, ristretto::multiply(b, p)), ristretto::multiply(b, ristretto::multiply(a, p)));
  EXPECT_NE(ristretto::multiply(a, p), ristretto::multiply(b, p));
  EXPECT_NE(a, b);
}

TEST(Ristretto, HashesSeparateDomainsAndRefuseBadInput) {
  const std::byte id[8] = {std::byte{7}};
  EXPECT_NE(ristretto::hash_to_element("troupe/psi/v1", id), ristretto::hash_to_element("troupe/other", id));
  EXPECT_EQ(ristretto::hash_to_element("troupe/psi/v1", id), ristretto::hash_to_element("troupe/psi/v1", id));
  EXPECT_TRUE(ristretto::is_valid(ristretto::hash_to_element("troupe/psi/v1", id)));
  ristretto::element bad;
  bad.fill(0xff);
  EXPECT_FALSE(ristretto::is_valid(bad));
  expect_error<std::invalid_argument>([&] { (void)ristretto::multiply(ristretto::random_scalar(), bad); }, "canonical encoding");
  ristretto::element identity{};  // the identity's encoding is all zeros
  expect_error<std::invalid_argument>([&] { (void)ristretto::multiply(ristretto::random_scalar(), identity); }, "identity");
  expect_error<std::invalid_argument>([&] { (void)ristretto::hash_to_element(std::string(256, 'x'), id); }, "longer than 255");
  expect_error<std::invalid_argument>([] { (void)ristretto::random_below(0); }, "positive");
}

TEST(Ristretto, ProductsAndHashesAreLibsodiumsBytes) {
  // The group arithmetic is the project's own (r255.hpp); the bytes are libsodium's, for any 32
  // scalar bytes (libsodium reads them as a 255-bit integer: the top bit dropped, not reduced).
  ASSERT_GE(sodium_init(), 0);
  for (int i = 0; i < 300; ++i) {
    std::byte msg[8];
    randombytes_buf(msg, sizeof msg);
    const auto p = ristretto::hash_to_element("troupe/psi/v1", msg);
    unsigned char digest[64];
    crypto_hash_sha512_state st;
    crypto_hash_sha512_init(&st);
    const unsigned char len = 13;
    crypto_hash_sha512_update(&st, &len, 1);
    crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>("troupe/psi/v1"), 13);
    crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>(msg), 8);
    crypto_hash_sha512_final(&st, digest);
    ristretto::element want;
    crypto_core_ristretto255_from_hash(want.data(), digest);
    ASSERT_EQ(p, want);
    ristretto::scalar s = ristretto::random_scalar();
    if (i % 3 == 1) randombytes_buf(s.data(), s.size());  // not reduced, top bit maybe set
    ASSERT_EQ(crypto_scalarmult_ristretto255(want.data(), s.data(), p.data()), 0);
    EXPECT_EQ(ristretto::multiply(s, p), want);
  }
}

TEST(Ristretto, BatchesGiveTheBytesOfOneByOne) {
  const auto s = ristretto::random_scalar();
  std::vector<std::array<std::byte, 8>> ids(37);
  std::vector<std::span<const std::byte>> messages;
  std::vector<ristretto::element> hashed;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    for (int b = 0; b < 8; ++b) ids[i][b] = static_cast<std::byte>((i * 977 + 3) >> (8 * b));
    messages.emplace_back(ids[i]);
    hashed.push_back(ristretto::hash_to_element("troupe/psi/v1", ids[i]));
  }
  const auto blinded = ristretto::hash_and_multiply(s, "troupe/psi/v1", messages);
  const auto again = ristretto::multiply_each(s, hashed);
  ASSERT_EQ(blinded.size(), ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(blinded[i], ristretto::multiply(s, hashed[i])) << i;
    EXPECT_EQ(again[i], blinded[i]) << i;
  }
  EXPECT_TRUE(ristretto::multiply_each(s, {}).empty());
  hashed[5].fill(0xff);
  expect_error<std::invalid_argument>([&] { (void)ristretto::multiply_each(s, hashed); }, "element 5: the 32 bytes are not the canonical");
  hashed[5] = ristretto::element{};  // the identity: a product that is the identity is refused
  expect_error<std::invalid_argument>([&] { (void)ristretto::multiply_each(s, hashed); }, "identity");
  expect_error<std::invalid_argument>([&] { (void)ristretto::hash_and_multiply(s, std::string(256, 'x'), messages); }, "longer than 255");
}

TEST(Ristretto, BatchedBlindingsAreLibsodiumsBytes) {
  // PSI's two batches (hash and blind the own IDs; decode and blind the peer's elements) against
  // libsodium's calls one by one, on random IDs, for counts around the batches' lanes and chunks.
  ASSERT_GE(sodium_init(), 0);
  for (std::size_t n : {1u, 8u, 13u, 301u}) {
    ristretto::scalar s = ristretto::random_scalar();
    if (n == 13) randombytes_buf(s.data(), s.size());  // not reduced, top bit maybe set
    std::vector<std::array<std::byte, 8>> ids(n);
    std::vector<std::span<const std::byte>> messages;
    std::vector<ristretto::element> hashed(n), blinded(n);
    for (std::size_t i = 0; i < n; ++i) {
      randombytes_buf(ids[i].data(), ids[i].size());
      messages.emplace_back(ids[i]);
      unsigned char digest[64];
      crypto_hash_sha512_state st;
      crypto_hash_sha512_init(&st);
      const unsigned char len = 13;
      crypto_hash_sha512_update(&st, &len, 1);
      crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>("troupe/psi/v1"), 13);
      crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>(ids[i].data()), 8);
      crypto_hash_sha512_final(&st, digest);
      crypto_core_ristretto255_from_hash(hashed[i].data(), digest);
      ASSERT_EQ(crypto_scalarmult_ristretto255(blinded[i].data(), s.data(), hashed[i].data()), 0);
    }
    EXPECT_EQ(ristretto::hash_and_multiply(s, "troupe/psi/v1", messages), blinded) << "n = " << n;
    std::vector<ristretto::element> again(n);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(crypto_scalarmult_ristretto255(again[i].data(), s.data(), blinded[i].data()), 0);
    EXPECT_EQ(ristretto::multiply_each(s, blinded), again) << "n = " << n;
  }
}

TEST(Psi, BothPartiesLearnTheTrueIntersectionAndTheOthersSize) {
  const auto s = make_sets(300, 500, 700, 1);
  const auto t = run_both(s.a, s.b);
  EXPECT_EQ(t.at_a, s.common);
  EXPECT_EQ(t.at_b, s.common);
  EXPECT_EQ(t.a_learns_size, s.b.size());
  EXPECT_EQ(t.b_learns_size, s.a.size());
}

TEST(Psi, DisjointIdenticalAndEmptySetsGiveTheirIntersections) {
  const auto disjoint = make_sets(200, 300, 0, 2);
  EXPECT_TRUE(run_both(disjoint.a, disjoint.b).at_a.empty());
  EXPECT_TRUE(run_both(disjoint.a, disjoint.b).at_b.empty());

  const auto same = make_sets(0, 0, 400, 3);
  EXPECT_EQ(run_both(same.a, same.b).at_a, same.common);
  EXPECT_EQ(run_both(same.b, same.a).at_b, same.common);

  const auto t = run_both({}, same.b);
  EXPECT_TRUE(t.at_a.empty());
  EXPECT_TRUE(t.at_b.empty());
  EXPECT_EQ(t.a_learns_size, same.b.size());
  EXPECT_EQ(t.b_learns_size, 0u);
  EXPECT_TRUE(run_both({}, {}).at_a.empty());
}

TEST(Psi, TranscriptCarriesOnlyBlindedElements) {
  const auto s = make_sets(100, 150, 120, 4);
  const auto t = run_both(s.a, s.b);
  std::vector<std::uint64_t> all = s.a;
  all.insert(all.end(), s.b.begin(), s.b.end());
  for (const auto* m : {&t.a1, &t.b1, &t.a2, &t.b2}) {
    ASSERT_EQ(m->size() % 32, 0u);
    // Every 32-byte piece is a valid group element, as a blinded one is.
    for (std::size_t off = 0; off < m->size(); off += 32) {
      ristretto::element e;
      std::memcpy(e.data(), m->data() + off, 32);
      EXPECT_TRUE(ristretto::is_valid(e));
    }
    // No raw ID (its 8 bytes, at any offset), no unblinded hash of one (its element or the
    // first 32 bytes of its SHA-512) is anywhere in it.
    for (std::uint64_t id : all) {
      std::byte raw[8];
      for (int b = 0; b < 8; ++b) raw[b] = static_cast<std::byte>(id >> (8 * b));
      EXPECT_EQ(std::search(m->begin(), m->end(), raw, raw + 8), m->end()) << "raw ID " << id;
      const auto h = ristretto::hash_to_element("troupe/psi/v1", raw);
      EXPECT_EQ(std::search(m->begin(), m->end(), reinterpret_cast<const std::byte*>(h.data()),
                            reinterpret_cast<const std::byte*>(h.data()) + 32),
                m->end())
          << "unblinded hash of ID " << id;
      unsigned char digest[64];
      crypto_hash_sha512(digest, reinterpret_cast<const unsigned char*>(raw), 8);
      EXPECT_EQ(std::search(m->begin(), m->end(), reinterpret_cast<const std::byte*>(digest),
                            reinterpret_cast<const std::byte*>(digest) + 32),
                m->end());
    }
  }
  // The sizes are what the peer learns: one element per ID, nothing more.
  EXPECT_EQ(t.a1.size(), 32 * s.a.size());
  EXPECT_EQ(t.b2.size(), 32 * s.a.size());
  EXPECT_EQ(t.b1.size(), 32 * s.b.size());
  // The same set, blinded again, looks unrelated: a fresh key per run.
  const auto again = run_both(s.a, s.b);
  std::set<std::vector<std::byte>> first;
  for (std::size_t off = 0; off < t.a1.size(); off += 32) first.emplace(t.a1.begin() + off, t.a1.begin() + off + 32);
  for (std::size_t off = 0; off < again.a1.size(); off += 32)
    EXPECT_FALSE(first.count(std::vector<std::byte>(again.a1.begin() + off, again.a1.begin() + off + 32)));
}

TEST(Psi, TheFirstMessageIsInARandomOrder) {
  // a holds 400 IDs whose first 200 are b's. From the messages alone, the positions in a's first
  // message of the common IDs show: a2 (a's blinding of b's message) holds exactly the doubly
  // blinded common elements, and b2 is a's message doubly blinded in a's order. Were a's
  // message in the order of its IDs, those positions would be 0..199.
  std::vector<std::uint64_t> ids(400);
  std::iota(ids.begin(), ids.end(), 1000);
  const std::vector<std::uint64_t> half(ids.begin(), ids.begin() + 200);
  psi_party a(ids, 2), b(half, 2);
  const auto a1 = a.blinded_ids(), b1 = b.blinded_ids();
  const auto a2 = a.blind_peer(b1), b2 = b.blind_peer(a1);
  std::set<std::vector<std::byte>> common;
  for (std::size_t off = 0; off < a2.size(); off += 32) common.emplace(a2.begin() + off, a2.begin() + off + 32);
  std::vector<std::size_t> positions;
  for (std::size_t i = 0; i < b2.size() / 32; ++i)
    if (common.count(std::vector<std::byte>(b2.begin() + 32 * i, b2.begin() + 32 * i + 32))) positions.push_back(i);
  ASSERT_EQ(positions.size(), 200u);
  std::vector<std::size_t> in_order(200);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_NE(positions, in_order);
  // A random half of 400 positions: about 100 of them in the first 200 (never near 0 or 200).
  const auto front = std::count_if(positions.begin(), positions.end(), [](std::size_t p) { return p < 200; });
  EXPECT_GT(front, 60);
  EXPECT_LT(front, 140);
}

TEST(Psi, MalformedMessagesFromThePeerAreClearErrors) {
  const auto s = make_sets(10, 10, 10, 5);
  psi_party a(s.a, 1), b(s.b, 1);
  auto a1 = a.blinded_ids();
  auto b1 = b.blinded_ids();
  // Wrong length.
  expect_error<std::invalid_argument>([&] { (void)a.blind_peer(std::span(b1).first(b1.size() - 1)); },
                                      "not a whole number of 32-byte");
  // An invalid encoding (all bits set is not canonical).
  auto bad = b1;
  std::fill(bad.begin() + 64, bad.begin() + 96, std::byte{0xff});
  expect_error<std::invalid_argument>([&] { (void)a.blind_peer(bad); }, "invalid element");
  // A repeated element.
  auto repeated = b1;
  std::copy(repeated.begin(), repeated.begin() + 32, repeated.begin() + 32);
  expect_error<std::invalid_argument>([&] { (void)a.blind_peer(repeated); }, "repeats an element");
  // intersect() before blind_peer() is a misuse.
  expect_error<std::logic_error>([&] { (void)a.intersect(b1); }, "before");
  auto a2 = a.blind_peer(b1);
  auto b2 = b.blind_peer(a1);
  // A second message with the wrong count, or an invalid element.
  expect_error<std::invalid_argument>([&] { (void)a.intersect(std::span(b2).first(b2.size() - 32)); }, "elements, but this party sent");
  auto bad2 = b2;
  std::fill(bad2.begin(), bad2.begin() + 32, std::byte{0xff});
  expect_error<std::invalid_argument>([&] { (void)a.intersect(bad2); }, "not a valid ristretto255 element");
  // Errors changed nothing: the honest messages still give the intersection.
  EXPECT_EQ(a.intersect(b2), s.common);
  EXPECT_EQ(b.intersect(a2), s.common);
  // A party's own repeated ID is refused.
  expect_error<std::invalid_argument>([] { psi_party p({1, 2, 1}); }, "more than once");
}

TEST(PsiScale, AlignsOneHundredThousandIdsPerParty) {
  // 90,000 common IDs of 100,000 per party, both parties' work in this process on every core.
  // Wall time depends on what else the cores run; the process's CPU time is printed beside it.
  const auto s = make_sets(10'000, 10'000, 90'000, 6);
  const std::clock_t cpu0 = std::clock();
  const auto r = run_psi(s.a, s.b);
  const double cpu = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
  EXPECT_EQ(r.intersection, s.common);
  EXPECT_EQ(r.transcript_bytes, 4u * 32 * 100'000);
  std::printf("PSI of 100,000 + 100,000 IDs (90,000 common): %.2f s wall, %.2f s CPU, on %u threads, transcript %.1f MB\n",
              r.seconds, cpu, std::max(1u, std::thread::hardware_concurrency()), r.transcript_bytes / 1e6);
}

}  // namespace
}  // namespace troupe::federated
