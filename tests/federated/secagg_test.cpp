#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include <troupe/federated/secagg.hpp>

namespace {

using namespace troupe::federated;
using namespace troupe::federated::secagg;

struct round_result {
  std::vector<float> sum;
  std::vector<std::int32_t> integer_sum;
  std::vector<std::int64_t> expected;  // Σ encode(input) over the clients that sent masked inputs
  std::vector<std::vector<std::uint32_t>> masked;
};

// Runs one round with every message passing through the server. Clients in `gone_before_mask`
// share their keys and then vanish; clients in `gone_after_mask` send their masked input and then
// do not answer the unmasking request.
round_result run_round(const config& cfg, const std::vector<std::vector<float>>& inputs,
                       const std::set<client_id>& gone_before_mask = {},
                       const std::set<client_id>& gone_after_mask = {}) {
  std::vector<client_id> ids;
  for (std::size_t i = 0; i < inputs.size(); ++i) ids.push_back(static_cast<client_id>(100 + 3 * i));
  graph g(ids, cfg);
  server srv(cfg, g);
  std::vector<client> clients;
  for (client_id id : ids) clients.emplace_back(id, cfg, g);
  for (auto& c : clients) srv.receive_keys(c.advertise());
  for (std::size_t i = 0; i < clients.size(); ++i) srv.receive_shares(clients[i].share_keys(srv.keys_for(ids[i])));
  round_result r;
  r.expected.assign(cfg.dim, 0);
  for (std::size_t i = 0; i < clients.size(); ++i) {
    if (gone_before_mask.count(ids[i])) continue;
    const auto in = clients[i].mask(srv.shares_for(ids[i]), inputs[i]);
    r.masked.push_back(in.values);
    srv.receive_masked(in);
    const auto e = encode(inputs[i], cfg);
    for (std::size_t j = 0; j < cfg.dim; ++j) r.expected[j] += e[j];
  }
  const auto request = srv.request_unmasking();
  for (std::size_t i = 0; i < clients.size(); ++i)
    if (!gone_before_mask.count(ids[i]) && !gone_after_mask.count(ids[i])) srv.receive_unmask(clients[i].unmask(request));
  r.sum = srv.finish();
  r.integer_sum = srv.integer_sum();
  return r;
}

std::vector<std::vector<float>> random_inputs(std::size_t clients, std::size_t dim, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<std::vector<float>> in(clients, std::vector<float>(dim));
  for (auto& v : in)
    for (float& x : v) x = u(rng);
  return in;
}

void expect_exact(const round_result& r) {
  ASSERT_EQ(r.integer_sum.size(), r.expected.size());
  for (std::size_t j = 0; j < r.expected.size(); ++j) ASSERT_EQ(r.integer_sum[j], r.expected[j]) << "coordinate " << j;
}

// ---- the mask generator ----------------------------------------------------------------------------

std::vector<mask_term> random_terms(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<mask_term> terms(count);
  for (auto& t : terms) {
    for (auto& b : t.seed) b = static_cast<std::uint8_t>(rng());
    t.subtract = rng() & 1;
  }
  return terms;
}

std::vector<std::uint32_t> random_words(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> v(n);
  for (auto& x : v) x = rng();
  return v;
}

TEST(MaskGenerator, StartsWithTheAesBlockOfCounterZero) {
  // AES-128 under the all-zero key encrypts the all-zero block to 66e94bd4 ef8a2c3b 884cfa59
  // ca342b2e (a known answer): the first four words of PRG(0), little-endian.
  const std::vector<mask_term> zero(1);
  for (bool reference : {false, true}) {
    std::vector<std::uint32_t> v(4, 0);
    apply_masks(v, zero, 0, reference);
    EXPECT_EQ(v, (std::vector<std::uint32_t>{0xd44be966u, 0x3b2c8aefu, 0x59fa4c88u, 0x2e2b34cau})) << "reference " << reference;
  }
}

TEST(MaskGenerator, FastPathGivesTheReferenceWordsForEveryLengthAndOffset) {
  if (!fast_masks_available()) std::printf("no VAES on this CPU: both calls take the reference path\n");
  std::uint32_t seed = 1;
  for (std::size_t n : {1u, 3u, 15u, 16u, 17u, 127u, 128u, 129u, 4095u, 4096u, 4097u, 79511u}) {
    for (std::size_t offset : {std::size_t{0}, std::size_t{4}, std::size_t{4096}, (std::size_t{1} << 34) - 8}) {
      const auto terms = random_terms(1 + seed % 15, seed);
      const auto start = random_words(n, seed + 1000);
      auto fast = start, reference = start;
      apply_masks(fast, terms, offset);
      apply_masks(reference, terms, offset, true);
      ASSERT_EQ(fast, reference) << n << " words at offset " << offset;
      ASSERT_NE(fast, start);
      ++seed;
    }
  }
}

TEST(MaskGenerator, ASliceAtAnOffsetIsThatPartOfTheWholeStream) {
  const auto terms = random_terms(3, 7);
  for (bool reference : {false, true}) {
    std::vector<std::uint32_t> whole(10000, 0);
    apply_masks(whole, terms, 0, reference);
    std::vector<std::uint32_t> slice(5000, 0);
    apply_masks(slice, terms, 4100, reference);
    EXPECT_TRUE(std::equal(slice.begin(), slice.end(), whole.begin() + 4100)) << "reference " << reference;
  }
  std::vector<std::uint32_t> v(8);
  EXPECT_THROW(apply_masks(v, terms, 2), std::invalid_argument);
}

TEST(MaskGenerator, SubtractingTheSameStreamsRestoresTheInput) {
  auto terms = random_terms(15, 11);
  const auto start = random_words(79511, 12);
  auto v = start;
  apply_masks(v, terms);
  EXPECT_NE(v, start);
  for (auto& t : terms) t.subtract = !t.subtract;
  apply_masks(v, terms);
  EXPECT_EQ(v, start);
}

TEST(Shamir, AnyThresholdSharesReconstructAndFewerDoNot) {
  key secret;
  for (std::size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<std::uint8_t>(7 * i + 255);
  const auto shares = split_secret(secret, 3, 6);
  for (std::size_t a = 0; a < 6; ++a)
    for (std::size_t b = a + 1; b < 6; ++b)
      for (std::size_t c = b + 1; c < 6; ++c) {
        std::vector<share> pick{shares[a], shares[b], shares[c]};
        EXPECT_EQ(reconstruct_secret(pick, 3), secret);
      }
  std::vector<share> two{shares[0], shares[4]};
  EXPECT_THROW(reconstruct_secret(two, 3), std::runtime_error);
  std::vector<share> repeated{shares[0], shares[0], shares[1]};
  EXPECT_THROW(reconstruct_secret(repeated, 3), std::runtime_error);
  EXPECT_THROW(split_secret(secret, 7, 6), std::invalid_argument);
}

TEST(SecAggPlus, SumsExactlyWithoutDropouts) {
  config cfg{.dim = 1000, .clip = 1.0, .max_clients = 20};
  const auto inputs = random_inputs(20, cfg.dim, 1);
  const auto r = run_round(cfg, inputs);
  expect_exact(r);
  for (std::size_t j = 0; j < cfg.dim; ++j) {
    double plain = 0;
    for (const auto& v : inputs) plain += v[j];
    EXPECT_NEAR(r.sum[j], plain, 20 / cfg.scale());
  }
}

TEST(SecAggPlus, SumsExactlyWhenTenPercentDropAfterMaskingAndSomeBefore) {
  config cfg{.dim = 300, .clip = 2.0, .max_clients = 40};
  const auto inputs = random_inputs(40, cfg.dim, 2);
  // 100 + 3i are the ids: four drop after masking (10%), two after sharing but before masking.
  const auto r = run_round(cfg, inputs, {100 + 3 * 5, 100 + 3 * 30}, {100, 100 + 3 * 7, 100 + 3 * 21, 100 + 3 * 39});
  EXPECT_EQ(r.masked.size(), 38u);
  expect_exact(r);
}

TEST(SecAggPlus, UsesALogarithmicDegreeAndTheFullGraphAsASetting) {
  std::vector<client_id> ids(100);
  for (client_id i = 0; i < 100; ++i) ids[i] = i;
  graph sparse(ids, config{.dim = 1, .max_clients = 100});
  EXPECT_EQ(sparse.degree(), 14u);  // 2 * ceil(log2 100)
  EXPECT_EQ(sparse.threshold(), 8u);
  EXPECT_EQ(sparse.neighbours(0), (std::vector<client_id>{1, 2, 3, 4, 5, 6, 7, 93, 94, 95, 96, 97, 98, 99}));
  graph full(ids, config{.dim = 1, .max_clients = 100, .full_graph = true});
  EXPECT_EQ(full.degree(), 99u);
  EXPECT_EQ(full.threshold(), 50u);

  config cfg{.dim = 64, .clip = 1.0, .max_clients = 12, .full_graph = true};
  expect_exact(run_round(cfg, random_inputs(12, 64, 3), {}, {104}));
}

TEST(SecAggPlus, TheServerSeesOnlyMaskedInputs) {
  config cfg{.dim = 2000, .clip = 1.0, .max_clients = 10};
  const auto inputs = random_inputs(10, cfg.dim, 4);
  const auto r = run_round(cfg, inputs);
  for (std::size_t c = 0; c < r.masked.size(); ++c) {
    const auto encoded = encode(inputs[c], cfg);
    std::size_t same = 0, high = 0;
    for (std::size_t j = 0; j < cfg.dim; ++j) {
      same += r.masked[c][j] == static_cast<std::uint32_t>(encoded[j]);
      high += r.masked[c][j] >> 31;
    }
    EXPECT_LE(same, 2u);
    EXPECT_NEAR(static_cast<double>(high) / cfg.dim, 0.5, 0.05);  // uniform-looking words
  }
}

TEST(SecAggPlus, FailsClearlyWhenTooManyClientsVanish) {
  config cfg{.dim = 16, .clip = 1.0, .max_clients = 8, .degree = 4, .threshold = 3};
  std::set<client_id> gone;
  for (client_id i = 0; i < 6; ++i) gone.insert(100 + 3 * i);
  EXPECT_THROW(run_round(cfg, random_inputs(8, 16, 5), {}, gone), std::runtime_error);
}

TEST(SecAggPlus, RefusesTamperedAndMalformedMessages) {
  config cfg{.dim = 8, .clip = 1.0, .max_clients = 4};
  graph g({1, 2, 3, 4}, cfg);
  server srv(cfg, g);
  std::vector<client> clients;
  for (client_id id : {1u, 2u, 3u, 4u}) clients.emplace_back(id, cfg, g);
  std::vector<public_keys> keys;
  for (auto& c : clients) srv.receive_keys(keys.emplace_back(c.advertise()));
  EXPECT_THROW(srv.receive_keys(keys[0]), std::invalid_argument);  // twice
  EXPECT_THROW(clients[0].advertise(), std::invalid_argument);
  for (std::size_t i = 0; i < 4; ++i) srv.receive_shares(clients[i].share_keys(srv.keys_for(static_cast<client_id>(i + 1))));
  auto boxes = srv.shares_for(1);
  ASSERT_FALSE(boxes.empty());
  auto tampered = boxes;
  tampered[0].box.back() ^= 1;
  const std::vector<float> input(8, 0.5f);
  EXPECT_THROW(clients[0].mask(tampered, input), std::invalid_argument);
  EXPECT_THROW(clients[0].mask(boxes, std::vector<float>(7, 0.5f)), std::invalid_argument);
  auto masked = clients[0].mask(boxes, input);
  masked.values.pop_back();
  EXPECT_THROW(srv.receive_masked(masked), std::invalid_argument);
  EXPECT_THROW(clients[0].unmask({{2}, {2}}), std::invalid_argument);  // both secrets of client 2
  EXPECT_THROW(graph({1}, cfg), std::invalid_argument);
  EXPECT_THROW(graph({1, 1, 2}, cfg), std::invalid_argument);
}

TEST(SecAggPlus, EncodingRoundsClipsAndRefusesNonFiniteInputs) {
  const config cfg{.dim = 6, .clip = 1, .max_clients = 2};  // scale 2^29: 2 * 1 * 2^29 < 2^31
  const auto e = encode(std::vector<float>{0.5f, -0.5f, 3.0f, -3.0f, 0x1p-30f, -0x1p-30f}, cfg);
  EXPECT_EQ(e, (std::vector<std::int32_t>{1 << 28, -(1 << 28), 1 << 29, -(1 << 29), 1, -1}));  // halves away from 0
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> in(6, 0.25f);
    in[4] = bad;
    EXPECT_THROW(encode(in, cfg), std::invalid_argument);
  }
}

// Rounding adds up to half a unit per input: the scale leaves room for it, so inputs at the
// clip whose bound sits right below 2^31 units still sum without wrapping.
TEST(SecAggPlus, TheScaleLeavesRoomForEachInputsRounding) {
  for (std::uint32_t n : {2u, 3u, 8u}) {
    const config cfg{.dim = 2, .clip = 2147483647.0 / 2147483648.0, .max_clients = n};
    EXPECT_LE(n * cfg.clip * cfg.scale() + 0.5 * n, 2147483647.0) << n;
    const auto r = run_round(cfg, std::vector<std::vector<float>>(n, {1.0f, -1.0f}));
    for (std::size_t j = 0; j < cfg.dim; ++j) EXPECT_EQ(static_cast<std::int64_t>(r.integer_sum[j]), r.expected[j]) << n;
    EXPECT_NEAR(r.sum[0], n * cfg.clip, 1e-6 * n) << n;
    EXPECT_NEAR(r.sum[1], -(n * cfg.clip), 1e-6 * n) << n;
  }
}

TEST(SecAggPlus, RefusesALowOrderPublicKey) {
  config cfg{.dim = 8, .clip = 1, .max_clients = 4};
  graph g({1, 2, 3, 4}, cfg);
  server srv(cfg, g);
  std::vector<client> clients;
  for (client_id id : {1, 2, 3, 4}) clients.emplace_back(id, cfg, g);
  for (auto& c : clients) srv.receive_keys(c.advertise());
  auto keys = srv.keys_for(1);
  keys[0].encryption = key{};  // the point of order 1: the agreed secret would be all zeros
  EXPECT_THROW(clients[0].share_keys(keys), std::invalid_argument);
}

}  // namespace
