// --tee sim: the simulated platform's quotes pass the DCAP verifier under the test root (and
// only there), bind the enclave key and the client's nonce; the enclave's sealing is bound to
// its measurement; oblivious densification leaves equal access traces; a run with the enclave
// gives the plain run's model bit for bit (FedAvg, top-k), and what cannot combine is refused.

#include <gtest/gtest.h>
#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "support.hpp"
#include "tee_box.hpp"
#include "tee_enclave.hpp"
#include "tee_tpm.hpp"
#include "troupe/federated/attest.hpp"
#include "troupe/federated/compress.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/federated/tee.hpp"

namespace troupe::federated {
namespace {

using test_support::expect_error;
using test_support::fashion;

std::int64_t now() { return static_cast<std::int64_t>(std::time(nullptr)); }

std::array<std::uint8_t, 32> sha256(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  std::array<std::uint8_t, 32> out{};
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  crypto_hash_sha256_update(&st, a.data(), a.size());
  crypto_hash_sha256_update(&st, b.data(), b.size());
  crypto_hash_sha256_final(&st, out.data());
  return out;
}

struct quoted {
  tee::bytes quote, key, nonce;
  std::array<std::uint8_t, 32> mr{};
};

quoted make_quoted(const tee::sim_platform& p) {
  quoted q;
  q.key.assign(32, 0);
  q.nonce.assign(32, 0);
  for (std::size_t i = 0; i < 32; ++i) q.key[i] = static_cast<std::uint8_t>(i * 7 + 1), q.nonce[i] = static_cast<std::uint8_t>(200 - i);
  for (std::size_t i = 0; i < 32; ++i) q.mr[i] = static_cast<std::uint8_t>(0xA0 + i);
  std::array<std::uint8_t, 64> report{};
  const auto h = sha256(q.key, q.nonce);
  std::copy(h.begin(), h.end(), report.begin());
  q.quote = tee::make_quote(p.material(), q.mr, report);
  return q;
}

dcap::policy test_policy(const tee::sim_platform& p, const quoted& q) {
  dcap::policy pol;
  pol.root_key_sha256 = p.root_key_sha256();
  pol.measurement = tee::bytes(q.mr.begin(), q.mr.end());
  pol.nonce = q.nonce;
  pol.enclave_key = q.key;
  return pol;
}

std::vector<tee::bytes> some_nonces(std::size_t n, std::uint8_t seed) {
  std::vector<tee::bytes> out;
  for (std::size_t i = 0; i < n; ++i) {
    tee::bytes b(32);
    for (std::size_t j = 0; j < b.size(); ++j) b[j] = static_cast<std::uint8_t>(seed + i * 31 + j * 7);
    out.push_back(b);
  }
  return out;
}

TEST(TeeSim, QuotesPassEveryDcapStepUnderTheTestRoot) {
  const tee::sim_platform p(now());
  const auto q = make_quoted(p);
  const auto c = dcap::parse_collateral(p.collateral_json());
  const auto v = dcap::verify_quote(dcap::parse_quote(q.quote), c, now(), test_policy(p, q));
  EXPECT_TRUE(v.ok()) << (v.failed ? dcap::to_string(*v.failed) : "") << ": " << v.error;
  EXPECT_EQ(v.passed.size(), static_cast<std::size_t>(dcap::verify_step_count));
  EXPECT_EQ(v.tcb_status, "UpToDate");
  EXPECT_TRUE(v.tcb_accepted);
  EXPECT_FALSE(v.debug);
  EXPECT_EQ(v.measurement, tee::bytes(q.mr.begin(), q.mr.end()));
}

TEST(TeeSim, QuotesFailUnderIntelsRootAndOutsideTheirWindow) {
  const tee::sim_platform p(now());
  const auto q = make_quoted(p);
  const auto c = dcap::parse_collateral(p.collateral_json());
  auto pol = test_policy(p, q);
  pol.root_key_sha256 = dcap::intel_sgx_root_key_sha256;
  auto v = dcap::verify_quote(dcap::parse_quote(q.quote), c, now(), pol);
  ASSERT_TRUE(v.failed.has_value());
  EXPECT_EQ(*v.failed, dcap::verify_step::crls) << v.error;
  v = dcap::verify_quote(dcap::parse_quote(q.quote), c, now() + 40 * 86400, test_policy(p, q));
  ASSERT_TRUE(v.failed.has_value());
  EXPECT_EQ(*v.failed, dcap::verify_step::crls) << v.error;
}

TEST(TeeSim, AVerdictHoldsUntilTheEarliestExpiryOfItsCollateralAndChainOnly) {
  // The test chain's certificates, CRLs, TCB info and QE identity all end 30 days after the
  // platform's start; OpenSSL holds a certificate or CRL expired at its notAfter or nextUpdate
  // itself, so the verdict's last second is the one before, and a second later the quote fails.
  const auto t0 = now();
  const tee::sim_platform p(t0);
  const auto q = make_quoted(p);
  const auto c = dcap::parse_collateral(p.collateral_json());
  const auto v = dcap::verify_quote(dcap::parse_quote(q.quote), c, t0, test_policy(p, q));
  ASSERT_TRUE(v.ok()) << v.error;
  EXPECT_EQ(v.valid_until, t0 + 30 * 86400 - 1);
  const auto last = dcap::verify_quote(dcap::parse_quote(q.quote), c, v.valid_until, test_policy(p, q));
  EXPECT_TRUE(last.ok()) << last.error;
  const auto late = dcap::verify_quote(dcap::parse_quote(q.quote), c, v.valid_until + 1, test_policy(p, q));
  ASSERT_TRUE(late.failed.has_value());
  // A verdict that failed before any dated step ran says nothing of expiry.
  auto pol = test_policy(p, q);
  pol.root_key_sha256 = dcap::intel_sgx_root_key_sha256;
  EXPECT_EQ(dcap::verify_quote(dcap::parse_quote(q.quote), c, t0, pol).valid_until, std::numeric_limits<std::int64_t>::max());
}

TEST(TeeSim, AnotherNonceKeyOrMeasurementFailsThePolicyAndAFlippedByteTheSignature) {
  const tee::sim_platform p(now());
  const auto q = make_quoted(p);
  const auto c = dcap::parse_collateral(p.collateral_json());
  auto expect_fail = [&](const tee::bytes& quote, const dcap::policy& pol, dcap::verify_step step) {
    const auto v = dcap::verify_quote(dcap::parse_quote(quote), c, now(), pol);
    ASSERT_TRUE(v.failed.has_value());
    EXPECT_EQ(*v.failed, step) << v.error;
  };
  auto pol = test_policy(p, q);
  pol.nonce->at(3) ^= 1;
  expect_fail(q.quote, pol, dcap::verify_step::policy);
  pol = test_policy(p, q);
  pol.enclave_key->at(0) ^= 1;
  expect_fail(q.quote, pol, dcap::verify_step::policy);
  pol = test_policy(p, q);
  pol.measurement->at(31) ^= 1;
  expect_fail(q.quote, pol, dcap::verify_step::policy);
  // A byte of the report body (its report data, at 48 + 320), of the quote's signature and of
  // the QE report (which the PCK key signed).
  for (auto [at, step] : {std::pair{48 + 330, dcap::verify_step::quote_signature},
                          std::pair{48 + 384 + 4 + 10, dcap::verify_step::quote_signature},
                          std::pair{48 + 384 + 4 + 128 + 100, dcap::verify_step::qe_report_signature}}) {
    auto bad = q.quote;
    bad[static_cast<std::size_t>(at)] ^= 0x40;
    expect_fail(bad, test_policy(p, q), step);
  }
}

TEST(TeeSim, TheSignatureStepAloneAcceptsTheQuoteAndRefusesAChangedBodyOrVendor) {
  const tee::sim_platform p(now());
  const auto q = make_quoted(p);
  EXPECT_TRUE(tee::quote_signature_verifies(dcap::parse_quote(q.quote)));
  auto body = q.quote;
  body[48 + 64] ^= 1;  // MRENCLAVE
  EXPECT_FALSE(tee::quote_signature_verifies(dcap::parse_quote(body)));
  auto vendor = q.quote;
  vendor[12] ^= 1;  // the QE vendor ID (signed too)
  EXPECT_FALSE(tee::quote_signature_verifies(dcap::parse_quote(vendor)));
  auto signature = q.quote;
  signature[48 + 384 + 4 + 40] ^= 1;
  EXPECT_FALSE(tee::quote_signature_verifies(dcap::parse_quote(signature)));
}

TEST(TeeSeal, ACheckpointOpensOnlyUnderItsOwnMeasurementAndPlatform) {
  tee::bytes secret(32, 9), other_secret(32, 10);
  std::array<std::uint8_t, 32> mr{}, other_mr{};
  mr.fill(1);
  other_mr.fill(1);
  other_mr[5] = 2;
  const tee::bytes state = {1, 2, 3, 4, 5};
  const auto box = tee::seal(tee::seal_key(secret, mr), state);
  EXPECT_EQ(tee::open_sealed(tee::seal_key(secret, mr), box), state);
  expect_error<std::runtime_error>([&] { (void)tee::open_sealed(tee::seal_key(secret, other_mr), box); }, "does not open");
  expect_error<std::runtime_error>([&] { (void)tee::open_sealed(tee::seal_key(other_secret, mr), box); }, "does not open");
  auto changed = box;
  changed.back() ^= 1;
  expect_error<std::runtime_error>([&] { (void)tee::open_sealed(tee::seal_key(secret, mr), changed); }, "does not open");
}

TEST(TeeSeal, AnEnclavesCheckpointRestoresItsKeyOnTheSamePlatformOnly) {
  const tee::sim_platform p(now());
  const auto m = p.material();
  tee::bytes secret(32, 3);
  tee_enclave a(m.attestation_key_pem, m.qe_part, secret, "");
  tee_enclave b(m.attestation_key_pem, m.qe_part, secret, "");
  tee_enclave other(m.attestation_key_pem, m.qe_part, tee::bytes(32, 4), "");
  ASSERT_NE(a.public_key(), b.public_key());
  const auto saved = a.checkpoint();
  b.restore(saved);
  EXPECT_EQ(a.public_key(), b.public_key());
  // The same key pair: a client's session with either gives the same round tags.
  tee::key32 pk{};
  std::copy_n(a.public_key().begin(), 32, pk.begin());
  const auto client = tee::make_sender(pk);
  const std::vector<tee::bytes> keys{tee::bytes(client.public_key.begin(), client.public_key.end())};
  const auto n = some_nonces(1, 3);
  EXPECT_EQ(a.begin(1, 1, 0, 1, false, n, {9}, keys), b.begin(1, 1, 0, 1, false, n, {9}, keys));
  expect_error<std::runtime_error>([&] { other.restore(saved); }, "does not open");
}

/// A dense update of `client` for `round`, boxed by `from` to the enclave under the round's
/// statement digest `aad`, as a client sends it.
std::vector<std::byte> sealed_update(const tee::box_sender& from, std::span<const std::uint8_t> aad, std::uint32_t round, std::uint64_t client,
                                     std::vector<float> v, double weight = 1.0) {
  tee::update_payload u{.round = round, .client = client, .weight = weight, .dim = static_cast<std::uint32_t>(v.size()), .sparse = false, .index = {}, .value = v};
  const auto plain = tee::encode_payload(u);
  std::vector<std::byte> out(plain.size() + tee::box_overhead);
  tee::seal_box(from, aad, {plain}, {reinterpret_cast<std::uint8_t*>(out.data()), out.size()});
  return out;
}

/// The associated data of open_round(e, round, n participants)'s boxes.
std::array<std::uint8_t, 32> round_aad(std::uint32_t round, std::size_t n) {
  return tee::statement_digest(tee::round_statement(round, 2, 0, 1, false, some_nonces(n, static_cast<std::uint8_t>(round))));
}

/// Opens `round` of dimension 2 (FedAvg) with these participants (ids 1, 2, ...); their tags.
std::vector<std::vector<std::uint8_t>> open_round(tee_enclave& e, std::uint32_t round, const std::vector<const tee::box_sender*>& who) {
  std::vector<std::uint64_t> ids;
  std::vector<tee::bytes> keys;
  for (std::size_t i = 0; i < who.size(); ++i) {
    ids.push_back(i + 1);
    keys.emplace_back(who[i]->public_key.begin(), who[i]->public_key.end());
  }
  return e.begin(round, 2, 0, 1, false, some_nonces(who.size(), static_cast<std::uint8_t>(round)), ids, keys);
}

tee::key32 key_of(const std::vector<std::uint8_t>& k) {
  tee::key32 out{};
  EXPECT_EQ(k.size(), out.size());
  std::copy_n(k.begin(), std::min(k.size(), out.size()), out.begin());
  return out;
}

TEST(TeeBox, ABoxSealedInPartsOpensToThePayloadsBytesUnderItsSessionOnly) {
  ASSERT_GE(sodium_init(), 0);
  tee::key32 pk{}, sk{};
  crypto_kx_keypair(pk.data(), sk.data());
  const auto a = tee::make_sender(pk), b = tee::make_sender(pk);
  tee::update_payload u{.round = 7, .client = 3, .weight = 2.5, .dim = 5, .sparse = true, .index = {4, 0, 0xFFFFFFFFu},
                        .value = {1.5f, -2.0f, 0.0f}};
  const auto plain = tee::encode_payload(u);
  const auto head = tee::payload_head(u, 3);
  std::vector<std::uint8_t> box(plain.size() + tee::box_overhead);
  const auto aad = tee::statement_digest(tee::round_statement(7, 5, 0, 1, false, some_nonces(2, 1)));
  tee::seal_box(a, aad, {head, {reinterpret_cast<const std::uint8_t*>(u.index.data()), 12}, {reinterpret_cast<const std::uint8_t*>(u.value.data()), 12}}, box);
  const auto rx = tee::session_with(pk, sk, std::span<const std::uint8_t, 32>(box.data(), 32)).rx;
  std::vector<std::uint8_t> opened;
  ASSERT_TRUE(tee::open_box(rx, aad, box, opened));
  EXPECT_EQ(opened, plain);
  // Two boxes of the same bytes differ (a fresh nonce each).
  std::vector<std::uint8_t> again(box.size());
  tee::seal_box(a, aad, {plain}, again);
  EXPECT_NE(again, box);
  ASSERT_TRUE(tee::open_box(rx, aad, again, opened));
  EXPECT_EQ(opened, plain);
  // Any changed byte, a cut box, another client's key, and another round's statement (here
  // another noise stddev, or no associated data) do not open.
  for (std::size_t i = 32; i < box.size(); i += 7) {
    auto bad = box;
    bad[i] ^= 0x10;
    EXPECT_FALSE(tee::open_box(rx, aad, bad, opened)) << "byte " << i;
  }
  EXPECT_FALSE(tee::open_box(rx, aad, std::span(box).first(box.size() - 1), opened));
  EXPECT_FALSE(tee::open_box(rx, aad, std::span(box).first(tee::box_overhead - 1), opened));
  EXPECT_FALSE(tee::open_box(rx, tee::statement_digest(tee::round_statement(7, 5, 0.5, 1, false, some_nonces(2, 1))), box, opened));
  EXPECT_FALSE(tee::open_box(rx, {}, box, opened));
  std::vector<std::uint8_t> other(box.size());
  tee::seal_box(b, aad, {plain}, other);
  EXPECT_FALSE(tee::open_box(rx, aad, other, opened));
  EXPECT_TRUE(tee::open_box(tee::session_with(pk, sk, std::span<const std::uint8_t, 32>(other.data(), 32)).rx, aad, other, opened));
}

TEST(TeeEnclave, OneQuoteBindsItsKeyAndEveryNonceOfTheBatch) {
  const tee::sim_platform p(now());
  const auto m = p.material();
  tee_enclave e(m.attestation_key_pem, m.qe_part, tee::bytes(32, 1), "");
  const auto nonces = some_nonces(5, 9);
  const auto quote = e.attest(nonces);
  const auto c = dcap::parse_collateral(p.collateral_json());
  dcap::policy pol;
  pol.root_key_sha256 = p.root_key_sha256();
  pol.measurement = e.measurement();
  pol.enclave_key = e.public_key();
  const auto list = tee::nonce_list_digest(nonces);
  pol.nonce = tee::bytes(list.begin(), list.end());
  const auto v = dcap::verify_quote(dcap::parse_quote(quote), c, now(), pol);
  EXPECT_TRUE(v.ok()) << (v.failed ? dcap::to_string(*v.failed) : "") << ": " << v.error;
  // A list without one nonce, in another order, or another key: the policy fails.
  auto expect_policy_fails = [&](const dcap::policy& bad) { EXPECT_NE(dcap::check_policy(dcap::parse_quote(quote), bad), ""); };
  auto fewer = nonces;
  fewer.pop_back();
  auto other = pol;
  const auto l1 = tee::nonce_list_digest(fewer);
  other.nonce = tee::bytes(l1.begin(), l1.end());
  expect_policy_fails(other);
  auto swapped = nonces;
  std::swap(swapped[0], swapped[1]);
  const auto l2 = tee::nonce_list_digest(swapped);
  other.nonce = tee::bytes(l2.begin(), l2.end());
  expect_policy_fails(other);
  other = pol;
  other.enclave_key->at(5) ^= 1;
  expect_policy_fails(other);
  expect_error<std::invalid_argument>([&] { (void)e.attest({tee::bytes(31, 0)}); }, "not 32");
  expect_error<std::invalid_argument>([&] { (void)e.attest({}); }, "no nonces");
}

TEST(TeeEnclave, ItsRoundTagsCheckUnderEachClientsSessionForThoseParametersOnly) {
  const tee::sim_platform p(now());
  const auto m = p.material();
  tee_enclave e(m.attestation_key_pem, m.qe_part, tee::bytes(32, 1), "");
  const auto pk = key_of(e.public_key());
  const std::vector<tee::box_sender> who{tee::make_sender(pk), tee::make_sender(pk), tee::make_sender(pk)};
  const std::vector<std::uint64_t> ids{4, 8, 15};
  std::vector<tee::bytes> keys;
  for (const auto& w : who) keys.emplace_back(w.public_key.begin(), w.public_key.end());
  const auto nonces = some_nonces(3, 40);
  const auto tags = e.begin(4, 10, 0.5, 3, false, nonces, ids, keys);
  ASSERT_EQ(tags.size(), 3u);
  auto checks = [&](std::size_t i, const tee::bytes& statement, std::uint64_t id) {
    const auto want = tee::round_tag(who[i].rx, statement, id);
    return tags[i] == tee::bytes(want.begin(), want.end());
  };
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(checks(i, tee::round_statement(4, 10, 0.5, 3, false, nonces), ids[i]));
    EXPECT_FALSE(checks(i, tee::round_statement(5, 10, 0.5, 3, false, nonces), ids[i]));
    EXPECT_FALSE(checks(i, tee::round_statement(4, 11, 0.5, 3, false, nonces), ids[i]));
    EXPECT_FALSE(checks(i, tee::round_statement(4, 10, 0.25, 3, false, nonces), ids[i]));
    EXPECT_FALSE(checks(i, tee::round_statement(4, 10, 0.5, 2, false, nonces), ids[i]));
    EXPECT_FALSE(checks(i, tee::round_statement(4, 10, 0.5, 3, true, nonces), ids[i]));
    EXPECT_FALSE(checks(i, tee::round_statement(4, 10, 0.5, 3, false, some_nonces(3, 41)), ids[i]));
    EXPECT_FALSE(checks(i, tee::round_statement(4, 10, 0.5, 3, false, nonces), ids[(i + 1) % 3]));
  }
  // The client that receives another's tag cannot check it: their sessions' keys differ.
  const auto first = tee::round_tag(who[1].rx, tee::round_statement(4, 10, 0.5, 3, false, nonces), ids[0]);
  EXPECT_NE(tags[0], tee::bytes(first.begin(), first.end()));
  expect_error<std::logic_error>([&] { (void)e.finish(); }, "no updates");
  // Client 8 presented under another key than the one it was first seen with: the round fails.
  auto changed = keys;
  const auto stranger = tee::make_sender(pk);
  changed[1].assign(stranger.public_key.begin(), stranger.public_key.end());
  expect_error<std::invalid_argument>([&] { (void)e.begin(5, 10, 0.5, 3, false, nonces, ids, changed); }, "another than its first");
  expect_error<std::invalid_argument>([&] { (void)e.begin(5, 10, 0.5, 3, false, nonces, {4, 8}, keys); }, "3 nonces, 2 clients");
}

TEST(TeeEnclave, OpensSealedUpdatesAndRefusesReplaysAndOtherRounds) {
  const tee::sim_platform p(now());
  const auto m = p.material();
  tee_enclave e(m.attestation_key_pem, m.qe_part, tee::bytes(32, 1), "");
  const auto pk = key_of(e.public_key());
  const auto one = tee::make_sender(pk), two = tee::make_sender(pk);
  auto box = [&](std::uint32_t round, std::uint64_t client, std::vector<float> v) {
    return sealed_update(client == 1 ? one : two, round_aad(round, 2), round, client, v);
  };
  open_round(e, 1, {&one, &two});
  e.add(1, box(1, 1, {1, 2}));
  e.add(2, box(1, 2, {3, 6}));
  EXPECT_EQ(e.finish(), (std::vector<float>{2, 4}));
  open_round(e, 2, {&one, &two});
  e.add(1, box(1, 1, {1, 2}));  // last round's box: sealed under last round's statement
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "does not open");
  open_round(e, 3, {&one, &two});
  e.add(1, box(3, 1, {1, 2}));
  e.add(1, box(3, 1, {1, 2}));
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "second box");
  open_round(e, 4, {&one, &two});
  e.add(2, sealed_update(two, round_aad(4, 2), 4, 1, {1, 2}));  // client 1's box presented as client 2's
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "client 1's");
  open_round(e, 5, {&one, &two});
  e.add(1, sealed_update(tee::make_sender(pk), round_aad(5, 2), 5, 1, {1, 2}));  // client 1 under a key not its own
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "another key than its own in this round");
  open_round(e, 6, {&one, &two});
  auto changed = box(6, 1, {1, 2});
  changed[50] ^= std::byte{1};
  e.add(1, changed);
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "does not open");
  open_round(e, 7, {&one, &two});
  e.add(1, box(7, 1, {1, 2}));
  EXPECT_EQ(e.finish(), (std::vector<float>{1, 2}));
  // Weights and values that are not finite are refused.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  open_round(e, 8, {&one, &two});
  e.add(1, sealed_update(one, round_aad(8, 2), 8, 1, {1, nan}));
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "not finite");
  open_round(e, 9, {&one, &two});
  e.add(1, sealed_update(one, round_aad(9, 2), 9, 1, {-inf, 1}));
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "not finite");
  open_round(e, 10, {&one, &two});
  e.add(1, sealed_update(one, round_aad(10, 2), 10, 1, {1, 2}, std::numeric_limits<double>::infinity()));
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "weight is not finite");
  open_round(e, 11, {&one, &two});
  e.add(1, sealed_update(one, round_aad(11, 2), 10, 1, {1, 2}));  // this round's statement, another round inside
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "round 10");
}

TEST(TeeEnclave, ARoundIsReleasedOnceAndNeverReopened) {
  // Releasing a round's boxes twice, once without the victim's, would give the victim's update
  // as the difference of the two aggregates: a released round never opens again.
  const tee::sim_platform p(now());
  const auto m = p.material();
  tee_enclave e(m.attestation_key_pem, m.qe_part, tee::bytes(32, 1), "");
  const auto pk = key_of(e.public_key());
  const auto one = tee::make_sender(pk), two = tee::make_sender(pk);
  auto box = [&](std::uint32_t round, std::uint64_t client, std::vector<float> v) {
    return sealed_update(client == 1 ? one : two, round_aad(round, 2), round, client, v);
  };
  open_round(e, 5, {&one, &two});
  expect_error<std::logic_error>([&] { open_round(e, 5, {&one, &two}); }, "still open");
  e.add(1, box(5, 1, {1, 2}));
  e.add(2, box(5, 2, {3, 6}));
  EXPECT_EQ(e.finish(), (std::vector<float>{2, 4}));
  expect_error<std::invalid_argument>([&] { open_round(e, 5, {&one, &two}); }, "after round 5");
  expect_error<std::invalid_argument>([&] { open_round(e, 4, {&one, &two}); }, "after round 5");
  open_round(e, 6, {&one, &two});
  e.add(2, box(6, 2, {3, 6}));
  EXPECT_EQ(e.finish(), (std::vector<float>{3, 6}));
}

TEST(TeeEnclave, AFailedRoundCannotBeReopenedOrReplayed) {
  // The host opens round 3 with noise, collects client 1's box, makes the round fail, and would
  // open round 3 again without noise to release client 1's box alone, exactly.
  const tee::sim_platform p(now());
  const auto m = p.material();
  const tee::bytes secret(32, 1);
  tee_enclave e(m.attestation_key_pem, m.qe_part, secret, "");
  const auto pk = key_of(e.public_key());
  const auto one = tee::make_sender(pk), two = tee::make_sender(pk);
  const std::vector<tee::bytes> keys{tee::bytes(one.public_key.begin(), one.public_key.end()),
                                     tee::bytes(two.public_key.begin(), two.public_key.end())};
  const auto nonces = some_nonces(2, 50);
  (void)e.begin(3, 2, 1.0, 2, false, nonces, {1, 2}, keys);
  const auto noisy = tee::statement_digest(tee::round_statement(3, 2, 1.0, 2, false, nonces));
  const auto victim = sealed_update(one, noisy, 3, 1, {5, 7});
  e.add(2, std::vector<std::byte>(80, std::byte{9}));  // garbage under the other id: the round fails
  e.add(1, victim);
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "client 2");
  // Its number is burnt: neither the same statement nor one without noise opens it again.
  expect_error<std::invalid_argument>([&] { (void)e.begin(3, 2, 0, 1, false, {nonces[0]}, {1}, {keys[0]}); }, "after round 3 was begun");
  expect_error<std::invalid_argument>([&] { (void)e.begin(3, 2, 1.0, 2, false, nonces, {1, 2}, keys); }, "after round 3 was begun");
  // And the box is bound to the statement its client checked: an enclave with the same keys (a
  // restored checkpoint) that opens round 3 with another noise, divisor or nonce list does not
  // open it; under the statement it was sealed for it does.
  auto opens_in = [&](double noise, double divisor, const std::vector<tee::bytes>& n) {
    tee_enclave other(m.attestation_key_pem, m.qe_part, secret, "");
    other.restore(e.checkpoint());
    const std::vector<std::uint64_t> ids{1, 2};
    (void)other.begin(3, 2, noise, divisor, false, n, std::vector<std::uint64_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n.size())),
                      std::vector<tee::bytes>(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n.size())));
    other.add(1, victim);
    try {
      (void)other.finish();
      return true;
    } catch (const std::runtime_error& err) {
      EXPECT_NE(std::string(err.what()).find("does not open"), std::string::npos) << err.what();
      return false;
    }
  };
  EXPECT_FALSE(opens_in(0, 1, nonces));
  EXPECT_FALSE(opens_in(1.0, 1, nonces));
  EXPECT_FALSE(opens_in(1.0, 2, some_nonces(2, 51)));
  EXPECT_FALSE(opens_in(1.0, 2, {nonces[0]}));
  EXPECT_TRUE(opens_in(1.0, 2, nonces));
}

TEST(TeeEnclave, OnlyTheRoundsParticipantsAddAndKeysArePinnedByBeginOnly) {
  const tee::sim_platform p(now());
  const auto m = p.material();
  tee_enclave e(m.attestation_key_pem, m.qe_part, tee::bytes(32, 1), "");
  const auto pk = key_of(e.public_key());
  const auto one = tee::make_sender(pk), two = tee::make_sender(pk), host = tee::make_sender(pk);
  // Round 1 has client 1 only: a box under id 2 (here the host's own key) is refused, and pins nothing.
  open_round(e, 1, {&one});
  e.add(1, sealed_update(one, round_aad(1, 1), 1, 1, {1, 2}));
  e.add(2, sealed_update(host, round_aad(1, 1), 1, 2, {100, 100}));
  expect_error<std::runtime_error>([&] { (void)e.finish(); }, "client 2: it is not a participant of round 1");
  // Client 2's first round, under its real key: begun, and its box adds.
  open_round(e, 2, {&one, &two});
  e.add(1, sealed_update(one, round_aad(2, 2), 2, 1, {1, 2}));
  e.add(2, sealed_update(two, round_aad(2, 2), 2, 2, {3, 6}));
  EXPECT_EQ(e.finish(), (std::vector<float>{2, 4}));
  // Client 2 is now pinned: the host's key under its id is refused at begin.
  expect_error<std::invalid_argument>([&] { (void)open_round(e, 3, {&one, &host}); }, "client 2: its key is another than its first");
  // A client listed twice is refused.
  const std::vector<tee::bytes> k1{tee::bytes(one.public_key.begin(), one.public_key.end()), tee::bytes(one.public_key.begin(), one.public_key.end())};
  expect_error<std::invalid_argument>([&] { (void)e.begin(4, 2, 0, 1, false, some_nonces(2, 4), {1, 1}, k1); }, "listed twice");
}

TEST(TeeEnclave, ItsNoiseIsStandardNormalAndAFunctionOfItsKeyOnly) {
  std::array<std::uint8_t, 32> key{}, other{};
  key.fill(7);
  other.fill(7);
  other[31] = 8;
  const std::size_t n = 200001;  // odd: the last draw is a pair's first half
  std::vector<double> a(n), b(n), c(n);
  tee::keyed_normal_draws(key, a);
  tee::keyed_normal_draws(key, b);
  tee::keyed_normal_draws(other, c);
  EXPECT_EQ(a, b);
  std::size_t same = 0;
  for (std::size_t i = 0; i < n; ++i) same += a[i] == c[i];
  EXPECT_LT(same, 5u);
  // N(0, 1): the mean within 5 standard errors of 0, the variance within 5 of 1 (its standard
  // error is sqrt(2 / n)), and P(|z| < 1) within 5 standard errors of 0.682689.
  const double mean = std::accumulate(a.begin(), a.end(), 0.0) / static_cast<double>(n);
  double var = 0;
  std::size_t inside = 0;
  for (double x : a) {
    var += (x - mean) * (x - mean);
    inside += std::abs(x) < 1.0;
    ASSERT_TRUE(std::isfinite(x));
  }
  var /= static_cast<double>(n - 1);
  EXPECT_LT(std::abs(mean), 5.0 / std::sqrt(static_cast<double>(n)));
  EXPECT_LT(std::abs(var - 1.0), 5.0 * std::sqrt(2.0 / static_cast<double>(n)));
  const double p1 = 0.682689492137;
  EXPECT_LT(std::abs(static_cast<double>(inside) / static_cast<double>(n) - p1), 5.0 * std::sqrt(p1 * (1 - p1) / static_cast<double>(n)));
  // A prefix of a longer stream is the shorter stream: the draws are the key's stream, in order.
  std::vector<double> shorter(1001);
  tee::keyed_normal_draws(key, shorter);
  EXPECT_TRUE(std::equal(shorter.begin(), shorter.end(), a.begin()));
}

TEST(TeeOblivious, MoreEntriesThanCoordinatesAreRefused) {
  std::vector<float> out(3);
  const std::vector<std::uint32_t> index{0, 1, 2, 0};
  const std::vector<float> value{1, 2, 3, 4};
  for (bool oblivious : {false, true})
    expect_error<std::invalid_argument>([&] { tee::densify(index, value, out, oblivious); }, "4 entries for an update of 3");
}

TEST(TeePayload, DecodingRefusesBadBytes) {
  tee::update_payload u{.round = 1, .client = 2, .weight = 1, .dim = 4, .sparse = true, .index = {0, 3}, .value = {1, 2}};
  auto b = tee::encode_payload(u);
  const auto back = tee::decode_payload(b);
  EXPECT_EQ(back.index, u.index);
  EXPECT_EQ(back.value, u.value);
  for (std::size_t cut = 0; cut < b.size(); ++cut)
    EXPECT_THROW((void)tee::decode_payload(std::span(b).first(cut)), std::invalid_argument) << cut;
  b.push_back(0);
  EXPECT_THROW((void)tee::decode_payload(b), std::invalid_argument);
  b = tee::encode_payload(u);
  b[0] ^= 1;
  EXPECT_THROW((void)tee::decode_payload(b), std::invalid_argument);
}

TEST(TeePayload, TheViewDecodesInPlaceWhatTheCopyDecodes) {
  tee::update_payload u{.round = 3, .client = 5, .weight = 0.5, .dim = 6, .sparse = true, .index = {5, 1, 0xFFFFFFFFu}, .value = {1, -2, 0}};
  for (bool sparse : {true, false}) {
    if (!sparse) {
      u.sparse = false;
      u.index.clear();
      u.value = {1, 2, 3, 4, 5, 6};
    }
    const auto b = tee::encode_payload(u);
    std::vector<std::uint32_t> words(b.size() / 4 + 1);  // aligned, and one word more to shift by a byte
    std::memcpy(words.data(), b.data(), b.size());
    const std::span<const std::uint8_t> aligned(reinterpret_cast<const std::uint8_t*>(words.data()), b.size());
    const auto v = tee::decode_payload_view(aligned);
    const auto c = tee::decode_payload(b);
    EXPECT_EQ(v.round, c.round);
    EXPECT_EQ(v.client, c.client);
    EXPECT_EQ(v.weight, c.weight);
    EXPECT_EQ(v.sparse, c.sparse);
    EXPECT_EQ(std::vector<std::uint32_t>(v.index.begin(), v.index.end()), c.index);
    EXPECT_EQ(std::vector<float>(v.value.begin(), v.value.end()), c.value);
    EXPECT_EQ(reinterpret_cast<const std::uint8_t*>(v.value.data()), aligned.data() + aligned.size() - 4 * u.value.size());  // no copy
    for (std::size_t cut = 0; cut < b.size(); cut += 4)
      EXPECT_THROW((void)tee::decode_payload_view(aligned.first(cut)), std::invalid_argument) << cut;
    std::memmove(reinterpret_cast<std::uint8_t*>(words.data()) + 1, b.data(), b.size());
    expect_error<std::invalid_argument>([&] { (void)tee::decode_payload_view({reinterpret_cast<const std::uint8_t*>(words.data()) + 1, b.size()}); },
                                        "aligned");
  }
}

TEST(TeeOblivious, DensifyMatchesTheSparseUpdatesOwnReference) {
  const std::size_t d = 1000;
  auto values = test_support::random_values(d, 77);
  std::vector<float> residual(d, 0.0f);
  const auto sparse = top_k(values, 0.05, residual);
  std::vector<float> want(d), plain(d), oblivious(d);
  sparse.densify(want);
  auto index = sparse.index;
  auto value = sparse.value;
  index.push_back(0xFFFFFFFFu);  // padding sets nothing
  value.push_back(0.0f);
  tee::densify(index, value, plain, false);
  tee::densify(index, value, oblivious, true);
  EXPECT_EQ(std::memcmp(want.data(), plain.data(), d * 4), 0);
  EXPECT_EQ(std::memcmp(want.data(), oblivious.data(), d * 4), 0);
  std::vector<std::uint32_t> outside{5, static_cast<std::uint32_t>(d)};
  std::vector<float> two{1, 2};
  EXPECT_THROW(tee::densify(outside, two, plain, true), std::invalid_argument);
}

TEST(TeeOblivious, AccessTracesOfTwoSparseInputsAreEqualWithTheFlagAndDifferWithout) {
  const std::size_t d = 64;
  const std::vector<std::uint32_t> first{1, 9, 40}, second{3, 17, 0xFFFFFFFFu};
  const std::vector<float> a{0.5f, -1.0f, 2.0f}, b{7.0f, 0.25f, 0.0f};
  std::vector<float> out(d);
  tee::access_trace t1, t2;
  tee::densify(first, a, out, true, &t1);
  tee::densify(second, b, out, true, &t2);
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(t1.size(), d * (1 + first.size()));
  tee::access_trace p1, p2;
  tee::densify(first, a, out, false, &p1);
  tee::densify(second, b, out, false, &p2);
  EXPECT_NE(p1, p2);
}

// ---- swtpm: a software TPM's quotes (skipped where swtpm and tpm2-tools are absent) ---------------

TEST(TeeTpm, AQuoteOfTheMeasuredPcrVerifiesAndAnythingElseFails) {
  if (!tee::swtpm_available()) GTEST_SKIP() << "swtpm and tpm2-tools are not installed";
  std::array<std::uint8_t, 32> measurement{}, other{}, qualifying{}, stale{};
  measurement.fill(0x11);
  other.fill(0x12);
  qualifying.fill(0x33);
  stale.fill(0x34);
  tee::swtpm_platform tpm(measurement);
  const auto q = tee::quote_with_tpm(tpm.tcti(), tpm.ak_context(), qualifying);
  const auto pcr = tee::pcr_after_extend(measurement);
  EXPECT_EQ(tee::verify_tpm_quote(q, tpm.ak_pem(), qualifying, pcr), "");
  EXPECT_NE(tee::verify_tpm_quote(q, tpm.ak_pem(), stale, pcr).find("qualifying data"), std::string::npos);
  EXPECT_NE(tee::verify_tpm_quote(q, tpm.ak_pem(), qualifying, tee::pcr_after_extend(other)).find("PCR 16"), std::string::npos);
  for (std::size_t at : {std::size_t{0}, std::size_t{4}, q.attest.size() / 2, q.attest.size() - 1}) {
    auto bad = q;
    bad.attest[at] ^= 1;
    EXPECT_NE(tee::verify_tpm_quote(bad, tpm.ak_pem(), qualifying, pcr).find("signature"), std::string::npos) << at;
  }
  tee::swtpm_platform another(measurement);  // another TPM's key: same PCR, same data, not its signature
  EXPECT_NE(tee::verify_tpm_quote(q, another.ak_pem(), qualifying, pcr).find("signature"), std::string::npos);
}

// ---- the whole protocol, with the enclave in its own process ------------------------------------

std::string enclave_program() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "tee_enclave_node").string();
}

simulation_options small_run() {
  auto o = test_support::small("fedavg", 2);
  o.clients = 12;
  o.per_round = 4;
  o.train_limit = 1200;
  return o;
}

simulation_options with_tee(simulation_options o) {
  o.tee = "sim";
  o.tee_root = "test";
  o.tee_program = enclave_program();
  return o;
}

void expect_same_models(simulation_options plain_options, simulation_options tee_options, int rounds) {
  if (!std::filesystem::exists(enclave_program())) GTEST_SKIP() << "no " << enclave_program();
  simulation plain(plain_options, fashion());
  simulation attested(tee_options, fashion());
  for (int r = 0; r < rounds; ++r) {
    plain.run_round();
    const auto report = attested.run_round();
    EXPECT_EQ(report.aborted, "");
    EXPECT_EQ(report.participants, tee_options.per_round);
    EXPECT_TRUE(std::any_of(report.metrics.begin(), report.metrics.end(), [](const auto& m) { return m.first == "tee_verify_ms"; }));
  }
  const auto a = plain.global_model(), b = attested.global_model();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(TeeRun, TheEnclavesAggregateIsBitIdenticalToPlainFedAvg) {
  const auto o = small_run();
  expect_same_models(o, with_tee(o), 2);
}

TEST(TeeRun, TopKWithTheEnclaveObliviousOrNotIsBitIdenticalToPlainTopK) {
  auto o = small_run();
  o.compress = "topk:0.05";
  expect_same_models(o, with_tee(o), 2);
  auto obl = with_tee(o);
  obl.tee_oblivious = true;
  expect_same_models(o, obl, 2);
}

TEST(TeeRun, UnderSwtpmTheAggregateIsBitIdenticalToPlainFedAvg) {
  if (!tee::swtpm_available()) GTEST_SKIP() << "swtpm and tpm2-tools are not installed";
  const auto o = small_run();
  auto t = with_tee(o);
  t.tee = "swtpm";
  expect_same_models(o, t, 2);
}

TEST(TeeRun, DpNoiseComesFromTheEnclaveAndEpsilonIsReported) {
  if (!std::filesystem::exists(enclave_program())) GTEST_SKIP() << "no " << enclave_program();
  auto o = with_tee(small_run());
  o.dp_clip = 1.0;
  o.dp_noise = 1.0;
  auto plain_options = small_run();
  plain_options.dp_clip = o.dp_clip;
  plain_options.dp_noise = o.dp_noise;
  simulation sim(o, fashion());
  simulation plain(plain_options, fashion());
  auto epsilon = [](const round_report& r) {
    const auto eps = std::find_if(r.metrics.begin(), r.metrics.end(), [](const auto& m) { return m.first == "epsilon"; });
    return eps == r.metrics.end() ? -1.0 : eps->second;
  };
  for (int round = 0; round < 2; ++round) {
    const auto report = sim.run_round();
    EXPECT_EQ(report.aborted, "");
    EXPECT_GT(epsilon(report), 0);
    EXPECT_EQ(epsilon(report), epsilon(plain.run_round()));  // the same accountant, the same steps
  }
  for (float x : sim.global_model()) ASSERT_TRUE(std::isfinite(x));
  // The noise is the enclave's own: the model differs from DP-FedAvg's with the host's seed.
  EXPECT_NE(std::memcmp(sim.global_model().data(), plain.global_model().data(), sim.global_model().size() * sizeof(float)), 0);
}

TEST(TeeRun, WhatCannotCombineIsRefused) {
  auto o = with_tee(small_run());
  o.tee_root = "";
  expect_error<std::invalid_argument>([&] { simulation sim(o, fashion()); }, "--tee-root test");
  o = with_tee(small_run());
  o.secagg = true;
  expect_error<std::invalid_argument>([&] { simulation sim(o, fashion()); }, "--secagg");
  o = with_tee(small_run());
  o.strategy = "median";
  expect_error<std::invalid_argument>([&] { simulation sim(o, fashion()); }, "--strategy median");
  o = with_tee(small_run());
  o.tee_oblivious = true;
  expect_error<std::invalid_argument>([&] { simulation sim(o, fashion()); }, "--compress topk");
  o = with_tee(small_run());
  o.tee_program = "/nonexistent/tee_enclave_node";
  expect_error<std::runtime_error>([&] { simulation sim(o, fashion()); }, "tee");
}

}  // namespace
}  // namespace troupe::federated
