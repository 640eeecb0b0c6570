// The GPT model from its spec ("gpt:layers=4,heads=4,embd=128,ctx=64"), built of kernels::
// layers: embedding, pre-norm transformer blocks, final layer norm, the LM head.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <stdexcept>
#include <utility>

#include "troupe/kernels/layers.hpp"

namespace troupe::kernels {

namespace {

[[noreturn]] void refuse(const std::string& spec, const std::string& why) {
  throw std::invalid_argument("model '" + spec + "': " + why +
                              " (the form is gpt:layers=4,heads=4,embd=128,ctx=64[,tie=1][,dropout=0.1])");
}

std::int64_t whole(const std::string& spec, const std::string& key, const std::string& value, std::int64_t most) {
  std::int64_t v = 0;
  const auto r = std::from_chars(value.data(), value.data() + value.size(), v);
  if (r.ec != std::errc() || r.ptr != value.data() + value.size() || v < 1)
    refuse(spec, key + "=" + value + " is not a positive whole number");
  if (v > most) refuse(spec, key + "=" + value + " is more than " + std::to_string(most));
  return v;
}

}  // namespace

gpt_spec parse_gpt_spec(const std::string& spec) {
  const std::string prefix = "gpt:";
  if (spec.rfind(prefix, 0) != 0) refuse(spec, "a GPT spec starts with gpt:");
  gpt_spec g;
  std::set<std::string> seen;
  std::string rest = spec.substr(prefix.size());
  std::size_t pos = 0;
  while (!rest.empty()) {
    const auto comma = rest.find(',', pos);
    const std::string item = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const auto eq = item.find('=');
    if (eq == std::string::npos) refuse(spec, "'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!seen.insert(key).second) refuse(spec, key + " is given twice");
    if (key == "layers") g.layers = whole(spec, key, value, 256);
    else if (key == "heads") g.heads = whole(spec, key, value, 16384);
    else if (key == "embd") g.embd = whole(spec, key, value, 16384);
    else if (key == "ctx") g.ctx = whole(spec, key, value, 65536);
    else if (key == "tie") {
      if (value != "0" && value != "1") refuse(spec, "tie must be 0 or 1");
      g.tie = value == "1";
    } else if (key == "dropout") {
      float p = -1;
      const auto r = std::from_chars(value.data(), value.data() + value.size(), p);
      if (r.ec != std::errc() || r.ptr != value.data() + value.size() || !(p >= 0.0f && p < 1.0f))
        refuse(spec, "dropout=" + value + " is not a probability in [0, 1)");
      g.dropout = p;
    } else {
      refuse(spec, "'" + key + "' is not a key (layers, heads, embd, ctx, tie, dropout)");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (g.heads > g.embd || g.embd % g.heads != 0)
    refuse(spec, "embd=" + std::to_string(g.embd) + " is not a multiple of heads=" + std::to_string(g.heads));
  if (g.tie)
    refuse(spec, "tie=1 (the head sharing the token embedding) is not supported yet; leave it out, the head keeps "
                 "its own weight");
  // Parameters of the blocks alone: 12 embd^2 each, under make_layer's limit of 2^28.
  if (12.0 * static_cast<double>(g.embd) * static_cast<double>(g.embd) * static_cast<double>(g.layers) > 268435456.0)
    refuse(spec, "more than 268435456 parameters");
  return g;
}

std::unique_ptr<sequential> make_gpt(const std::string& spec, std::int64_t vocab) {
  const gpt_spec g = parse_gpt_spec(spec);
  if (vocab < 1 || vocab > (std::int64_t{1} << 20))
    throw std::invalid_argument("a GPT needs a vocabulary of 1 to 1048576 tokens, not " + std::to_string(vocab));
  auto m = std::make_unique<sequential>();
  m->add(make_embedding(vocab, g.ctx, g.embd));
  if (g.dropout > 0) m->add(make_dropout(g.dropout));
  for (std::int64_t i = 0; i < g.layers; ++i) {
    auto attend = std::make_unique<sequential>();
    attend->add(make_layer_norm(g.embd));
    attend->add(make_attention(g.embd, g.heads, g.ctx));
    if (g.dropout > 0) attend->add(make_dropout(g.dropout));
    m->add(make_residual(std::move(attend)));
    auto mlp = std::make_unique<sequential>();
    mlp->add(make_layer_norm(g.embd));
    mlp->add(make_linear(g.embd, 4 * g.embd));
    mlp->add(make_gelu());
    mlp->add(make_linear(4 * g.embd, g.embd));
    if (g.dropout > 0) mlp->add(make_dropout(g.dropout));
    m->add(make_residual(std::move(mlp)));
  }
  m->add(make_layer_norm(g.embd));
  m->add(make_linear(g.embd, vocab, false));
  return m;
}

}  // namespace troupe::kernels
