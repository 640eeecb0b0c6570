// The transformer's layers: the tiled attention against its reference, finite differences, the
// split backward, descriptions, and the GPT spec.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include <troupe/kernels/attention.hpp>
#include <troupe/kernels/layers.hpp>

#include "fast_gelu.hpp"

namespace {

using namespace troupe;
using namespace troupe::kernels;

tensor random_tensor(tensor::shape_type shape, std::mt19937& rng, float lo = -1, float hi = 1) {
  auto t = tensor::empty(std::move(shape));
  std::uniform_real_distribution<float> u(lo, hi);
  for (float& v : t.data<float>()) v = u(rng);
  return t;
}

tensor random_ids(std::int64_t n, std::int64_t vocab, std::mt19937& rng) {
  auto t = tensor::empty({n, 1});
  std::uniform_int_distribution<int> u(0, static_cast<int>(vocab) - 1);
  for (float& v : t.data<float>()) v = static_cast<float>(u(rng));
  return t;
}

void expect_close(const tensor& got, const tensor& want, const std::string& what, double abs = 1e-5, double rel = 1e-4) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  auto g = got.data<float>();
  auto w = want.data<float>();
  for (std::size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], abs + rel * std::abs(w[i])) << what << "[" << i << "]";
}

void expect_same_bits(const tensor& a, const tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(std::memcmp(a.bytes(), b.bytes(), a.nbytes()), 0) << what;
}

double projected(layer& l, const tensor& x, const tensor& r) {
  saved_activations keep;
  tensor y = l.forward(x, keep, false);
  double s = 0;
  auto yd = y.data<float>();
  auto rd = r.data<float>();
  for (std::size_t i = 0; i < yd.size(); ++i) s += static_cast<double>(yd[i]) * rd[i];
  return s;
}

/// Central differences of sum(y * r) against the backward's gradients; `input_grad` false for
/// token ids (whose gradient must be zeros).
void check_gradients(layer& l, tensor x, std::mt19937& rng, bool input_grad = true, double h = 1e-2, double tol = 2e-2) {
  saved_activations keep;
  tensor y = l.forward(x, keep, false);
  tensor r = random_tensor(y.shape(), rng);
  for (auto* p : l.parameters())
    for (float& g : p->grad.data<float>()) g = 0;
  tensor dx = l.backward_input(r, keep);
  l.backward_weight(r, keep);
  EXPECT_EQ(keep.bytes(), 0u) << l.describe() << " keeps activations after backward_weight";
  auto fd = [&](float& v) {
    const float saved = v;
    v = saved + static_cast<float>(h);
    const double up = projected(l, x, r);
    v = saved - static_cast<float>(h);
    const double down = projected(l, x, r);
    v = saved;
    return (up - down) / (2 * h);
  };
  auto dxd = dx.data<float>();
  if (input_grad) {
    auto xd = x.data<float>();
    for (std::size_t i = 0; i < xd.size(); ++i) {
      const double numeric = fd(xd[i]);
      EXPECT_NEAR(dxd[i], numeric, tol * (1 + std::abs(numeric))) << l.describe() << " dx[" << i << "]";
    }
  } else {
    EXPECT_EQ(dx.shape(), x.shape());
    for (float v : dxd) EXPECT_EQ(v, 0.0f);
  }
  for (auto* p : l.parameters()) {
    auto v = p->value.data<float>();
    auto g = p->grad.data<float>();
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double numeric = fd(v[i]);
      EXPECT_NEAR(g[i], numeric, tol * (1 + std::abs(numeric))) << l.describe() << " " << p->name << "[" << i << "]";
    }
  }
}

/// Two copies of a layer: backward() on one, backward_input then backward_weight on the other.
void check_split(const std::function<std::unique_ptr<layer>()>& make, const tensor& x, std::mt19937& rng) {
  auto a = make(), b = make();
  a->initialize(7);
  b->initialize(7);
  saved_activations ka, kb;
  tensor ya = a->forward(x, ka, true), yb = b->forward(x, kb, true);
  expect_same_bits(ya, yb, a->describe() + " forward");
  tensor dy = random_tensor(ya.shape(), rng);
  tensor dxa = a->backward(dy, ka);
  tensor dxb = b->backward_input(dy, kb);
  EXPECT_GT(kb.bytes(), 0u) << "what the weight gradients need waits for backward_weight";
  b->backward_weight(dy, kb);
  EXPECT_EQ(kb.bytes(), 0u);
  expect_same_bits(dxa, dxb, a->describe() + " dx");
  auto pa = a->parameters(), pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) expect_same_bits(pa[i]->grad, pb[i]->grad, pa[i]->name);
}

TEST(Attention, TheTiledKernelEqualsTheReferenceForwardAndBackward) {
  std::mt19937 rng(11);
  struct shape { std::int64_t batch, ctx, heads, d, tile; };
  // Contexts that are not a multiple of the tile, one shorter than a tile, and one tile exactly.
  for (const shape s : {shape{2, 13, 2, 5, 4}, shape{1, 70, 3, 8, 32}, shape{3, 3, 1, 4, 8}, shape{2, 16, 2, 3, 16},
                        shape{1, 9, 4, 1, 1}}) {
    const std::string what = "ctx " + std::to_string(s.ctx) + ", tile " + std::to_string(s.tile);
    const tensor qkv = random_tensor({s.batch * s.ctx, 3 * s.heads * s.d}, rng, -2, 2);
    tensor out, lse, ref_out, ref_lse;
    causal_attention_forward(qkv, s.ctx, s.heads, out, lse, s.tile);
    causal_attention_forward_reference(qkv, s.ctx, s.heads, ref_out, ref_lse);
    expect_close(out, ref_out, what + " out");
    expect_close(lse, ref_lse, what + " lse");
    const tensor dout = random_tensor(out.shape(), rng);
    tensor dqkv, ref_dqkv;
    causal_attention_backward(dout, qkv, out, lse, s.ctx, s.heads, dqkv, s.tile);
    causal_attention_backward_reference(dout, qkv, s.ctx, s.heads, ref_dqkv);
    expect_close(dqkv, ref_dqkv, what + " dqkv", 1e-4, 1e-4);
  }
}

TEST(Attention, TheFirstRowSeesOnlyItselfAndLaterRowsNeverReachEarlierOnes) {
  // The causal mask by its definition: row 0's output is its own v; changing the last row's
  // q, k, v changes no earlier output.
  std::mt19937 rng(12);
  const std::int64_t ctx = 6, heads = 2, d = 3, c = heads * d;
  tensor qkv = random_tensor({ctx, 3 * c}, rng);
  tensor out, lse;
  causal_attention_forward(qkv, ctx, heads, out, lse, 4);
  for (std::int64_t k = 0; k < c; ++k) EXPECT_FLOAT_EQ(out.data<float>()[k], qkv.data<float>()[2 * c + k]);
  tensor changed = qkv.clone();
  for (std::int64_t k = 0; k < 3 * c; ++k) changed.data<float>()[(ctx - 1) * 3 * c + k] += 1.0f;
  tensor out2, lse2;
  causal_attention_forward(changed, ctx, heads, out2, lse2, 4);
  EXPECT_EQ(std::memcmp(out.bytes(), out2.bytes(), static_cast<std::size_t>((ctx - 1) * c) * sizeof(float)), 0);
}

TEST(Attention, RefusesShapesThatAreNotSequencesOfHeads) {
  tensor out, lse;
  EXPECT_THROW(causal_attention_forward(tensor::zeros({10, 12}), 4, 2, out, lse), std::invalid_argument);  // 10 % 4
  EXPECT_THROW(causal_attention_forward(tensor::zeros({8, 10}), 4, 2, out, lse), std::invalid_argument);   // 10 % 6
  EXPECT_THROW(causal_attention_forward(tensor::zeros({8, 12}), 4, 2, out, lse, 0), std::invalid_argument);
  EXPECT_THROW(make_attention(10, 3, 4), std::invalid_argument);
}

TEST(Gelu, TheVectorizedGeluIsWithinFourTenMillionthsOfItsDefinition) {
  // Every 1/4096 from -12 to 12, and the far tails where exp underflows.
  std::vector<float> x;
  for (int i = -12 * 4096; i <= 12 * 4096; ++i) x.push_back(static_cast<float>(i) / 4096.0f);
  for (float v : {-100.0f, -30.0f, 30.0f, 100.0f, 0.0f, -0.0f}) x.push_back(v);
  std::vector<float> y(x.size()), dx(x.size()), ones(x.size(), 1.0f);
  detail::gelu_rows(x.data(), y.data(), x.size());
  detail::gelu_grad_rows(x.data(), ones.data(), dx.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    ASSERT_NEAR(y[i], detail::gelu_reference(v), 4e-7 * (1 + std::abs(v))) << "gelu(" << v << ")";
    ASSERT_NEAR(dx[i], detail::gelu_slope_reference(v), 4e-7 * (1 + std::abs(v))) << "gelu'(" << v << ")";
  }
  EXPECT_NEAR(detail::exp_approx(1.0f), std::exp(1.0), 1e-6);
  EXPECT_NEAR(detail::exp_approx(-20.0f) / std::exp(-20.0), 1.0, 1e-6);
}

TEST(GptLayers, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(13);
  auto emb = make_embedding(7, 4, 5);
  emb->initialize(1);
  check_gradients(*emb, random_ids(8, 7, rng), rng, false);
  auto att = make_attention(6, 2, 5);
  att->initialize(2);
  check_gradients(*att, random_tensor({10, 6}, rng), rng);
  // A whole small GPT, from the ids to the logits.
  // A whole small GPT, from the ids to the logits; its parameters of order one (embeddings of
  // 0.02 would put the layer norms where a float difference quotient means nothing).
  auto gpt = make_gpt("gpt:layers=1,heads=2,embd=4,ctx=3", 5);
  for (auto* p : gpt->parameters()) p->value = random_tensor(p->value.shape(), rng);
  check_gradients(*gpt, random_ids(6, 5, rng), rng, false);
}

TEST(GptLayers, TheSplitHalvesTogetherEqualTheFullBackward) {
  std::mt19937 rng(14);
  check_split([] { return make_embedding(9, 4, 6); }, random_ids(12, 9, rng), rng);
  check_split([] { return make_attention(8, 2, 6); }, random_tensor({12, 8}, rng), rng);
  check_split([] { return make_linear(6, 5, false); }, random_tensor({4, 6}, rng), rng);
  check_split([] { return std::unique_ptr<layer>(make_gpt("gpt:layers=2,heads=2,embd=8,ctx=4,dropout=0.2", 11)); },
              random_ids(8, 11, rng), rng);
}

TEST(GptLayers, TheEmbeddingAddsTokenAndPositionRowsAndRefusesBadIds) {
  auto emb = make_embedding(3, 2, 2);
  emb->initialize(5);
  auto p = emb->parameters();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0]->name, "wte");
  EXPECT_EQ(p[1]->name, "wpe");
  saved_activations keep;
  const tensor x = tensor::from<float>({2, 0, 1, 1}, {4, 1});
  const tensor y = emb->forward(x, keep, true);
  auto te = p[0]->value.data<float>();
  auto pe = p[1]->value.data<float>();
  const int ids[] = {2, 0, 1, 1};
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 2; ++k) EXPECT_EQ(y.data<float>()[r * 2 + k], te[ids[r] * 2 + k] + pe[(r % 2) * 2 + k]);
  for (float bad : {3.0f, -1.0f, 0.5f, NAN}) {
    tensor b = tensor::from<float>({0, bad}, {2, 1});
    EXPECT_THROW(emb->forward(b, keep, true), std::invalid_argument) << bad;
  }
  EXPECT_THROW(emb->forward(tensor::zeros({3, 1}), keep, true), std::invalid_argument);  // not whole sequences
  // Normal(0, 0.02): a large table's spread says so.
  auto big = make_embedding(1000, 1, 64);
  big->initialize(6);
  double sum = 0, sq = 0;
  for (float v : big->parameters()[0]->value.data<float>()) sum += v, sq += static_cast<double>(v) * v;
  const double n = 64000, mean = sum / n;
  EXPECT_NEAR(mean, 0, 1e-3);
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 0.02, 1e-3);
}

TEST(GptLayers, MakeLayerRebuildsWhatDescribeWrites) {
  for (std::string d : {"embedding(vocab=65, ctx=64, embd=128)", "attention(128, heads=4, ctx=64)",
                        "linear(128->65, bias=false)"}) {
    EXPECT_EQ(make_layer(d)->describe(), d);
  }
  auto gpt = make_gpt("gpt:layers=2,heads=2,embd=8,ctx=4,dropout=0.1", 11);
  const std::string d = gpt->describe();
  auto again = make_layer(d);
  EXPECT_EQ(again->describe(), d);
  std::int64_t n = 0;
  for (auto* p : gpt->parameters()) n += p->value.numel();
  EXPECT_EQ(parameter_count(d), n);
  // 11*8 + 4*8 embeddings; per block 2 norms (32), qkv 8*24+24, proj 8*8+8, mlp 8*32+32 + 32*8+8;
  // final norm 16; head 8*11.
  EXPECT_EQ(n, 88 + 32 + 2 * (32 + 216 + 72 + 288 + 264) + 16 + 88);
  EXPECT_THROW(make_layer("attention(10, heads=3, ctx=4)"), std::invalid_argument);
  EXPECT_THROW(make_layer("embedding(vocab=0, ctx=4, embd=2)"), std::invalid_argument);
  EXPECT_THROW(make_layer("linear(4->2, bias=true)"), std::invalid_argument);
}

TEST(GptSpec, SpecsAreParsedOrRefusedWithTheReason) {
  const auto g = parse_gpt_spec("gpt:layers=6,heads=6,embd=384,ctx=256,dropout=0.2");
  EXPECT_EQ(g.layers, 6);
  EXPECT_EQ(g.heads, 6);
  EXPECT_EQ(g.embd, 384);
  EXPECT_EQ(g.ctx, 256);
  EXPECT_FLOAT_EQ(g.dropout, 0.2f);
  const auto defaults = parse_gpt_spec("gpt:");
  EXPECT_EQ(defaults.layers, 4);
  EXPECT_EQ(defaults.embd, 128);
  const auto refused = [](const std::string& spec, const std::string& why) {
    try {
      parse_gpt_spec(spec);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused("gpt:embd=130,heads=4", "is not a multiple of heads=4");
  refused("gpt:layers=0", "layers=0 is not a positive whole number");
  refused("gpt:layers=-2", "is not a positive whole number");
  refused("gpt:layers=1000", "is more than 256");
  refused("gpt:ctx=1e9", "is not a positive whole number");
  refused("gpt:width=3", "'width' is not a key");
  refused("gpt:layers=2,layers=3", "layers is given twice");
  refused("gpt:dropout=1", "not a probability");
  refused("gpt:tie=1", "tie=1");
  refused("gpt:tie=yes", "tie must be 0 or 1");
  refused("gpt:layers", "is not key=value");
  refused("mlp:1-2", "starts with gpt:");
  refused("gpt:layers=256,embd=16384,heads=1", "more than 268435456 parameters");
  EXPECT_THROW(make_gpt("gpt:", 0), std::invalid_argument);
}

}  // namespace
