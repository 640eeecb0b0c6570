// Models from text: make_layer and parameter_count read what describe() writes; make_mlp and
// mlp_sizes read "mlp:784-256-128-10".

#include "troupe/kernels/layers.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace troupe::kernels {

std::vector<std::int64_t> mlp_sizes(const std::string& spec) {
  const std::string prefix = "mlp:";
  if (spec.rfind(prefix, 0) != 0)
    throw std::invalid_argument("model '" + spec + "' is not of the form mlp:784-256-128-10");
  constexpr std::int64_t widest = std::int64_t{1} << 20, most_params = std::int64_t{1} << 28;
  std::vector<std::int64_t> sizes;
  const std::string rest = spec.substr(prefix.size());
  std::size_t pos = 0;
  for (;;) {
    const auto dash = rest.find('-', pos);
    const auto item = rest.substr(pos, dash == std::string::npos ? std::string::npos : dash - pos);
    // Digits only (strtoll would take spaces and signs); more than 7 is beyond the limit anyway.
    const bool digits =
        !item.empty() && std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits && (item.size() > 7 || std::stoll(item) > widest))
      throw std::invalid_argument("model '" + spec + "': a layer of " + item + " units (at most " +
                                  std::to_string(widest) + ")");
    const std::int64_t v = digits ? std::stoll(item) : 0;
    if (v < 1) throw std::invalid_argument("model '" + spec + "': '" + item + "' is not a positive layer size");
    sizes.push_back(v);
    if (dash == std::string::npos) break;
    pos = dash + 1;
  }
  if (sizes.size() < 2) throw std::invalid_argument("model '" + spec + "' needs at least an input and an output size");
  std::int64_t params = 0;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) params += sizes[i] * sizes[i + 1] + sizes[i + 1];
  if (params > most_params)
    throw std::invalid_argument("model '" + spec + "' has " + std::to_string(params) + " parameters (at most " +
                                std::to_string(most_params) + ")");
  return sizes;
}

namespace {

/// Reads what describe() writes (make_layer's grammar), one layer at a time: a first pass checks
/// the whole text and counts its parameters without building anything, the second builds.
class description_reader {
public:
  explicit description_reader(std::string_view text) : text_(text) {}

  std::unique_ptr<layer> whole() {
    read(true);
    return read(false);
  }
  std::int64_t parameters() {
    read(true);
    return params_;
  }

private:
  std::unique_ptr<layer> read(bool dry) {
    dry_ = dry;
    pos_ = 0;
    params_ = 0;
    auto l = next_layer(0);
    if (pos_ != text_.size()) fail("unexpected text after the layer");
    return l;
  }

  static constexpr int deepest = 64;
  static constexpr std::int64_t widest = std::int64_t{1} << 20, most_params = std::int64_t{1} << 28;

  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument("layer description '" + std::string(text_) + "': " + why + " (at character " +
                                std::to_string(pos_) + ")");
  }
  bool eat(std::string_view s) {
    if (text_.substr(pos_, s.size()) != s) return false;
    pos_ += s.size();
    return true;
  }
  void expect(std::string_view s) {
    if (!eat(s)) fail("expected '" + std::string(s) + "'");
  }
  std::string_view word() {
    const auto start = pos_;
    while (pos_ < text_.size() && (std::isalpha(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    return text_.substr(start, pos_ - start);
  }
  std::int64_t size() {
    std::int64_t v = 0;
    const auto r = std::from_chars(text_.data() + pos_, text_.data() + text_.size(), v);
    if (r.ec != std::errc() || v < 1 || v > widest)
      fail("expected a size from 1 to " + std::to_string(widest));
    pos_ = static_cast<std::size_t>(r.ptr - text_.data());
    return v;
  }
  /// Adds a layer's parameters to the description's total, which has a limit as mlp_sizes has
  /// (a few bytes of text must not allocate gigabytes).
  void count_params(std::int64_t n) {
    params_ += n;
    if (params_ > most_params)
      fail("more than " + std::to_string(most_params) + " parameters in all");
  }
  float number() {
    float v = 0;
    const auto r = std::from_chars(text_.data() + pos_, text_.data() + text_.size(), v);
    if (r.ec != std::errc() || !std::isfinite(v)) fail("expected a number");
    pos_ = static_cast<std::size_t>(r.ptr - text_.data());
    return v;
  }

  std::unique_ptr<layer> next_layer(int depth) {
    if (depth > deepest) fail("layers nested more than " + std::to_string(deepest) + " deep");
    const auto name = word();
    if (name == "relu") return dry_ ? nullptr : make_relu();
    if (name == "gelu") return dry_ ? nullptr : make_gelu();
    if (name == "linear") {
      expect("(");
      const auto in = size();
      expect("->");
      const auto out = size();
      const bool bias = !eat(", bias=false");
      expect(")");
      count_params(in * out + (bias ? out : 0));
      return dry_ ? nullptr : make_linear(in, out, bias);
    }
    if (name == "embedding") {
      expect("(vocab=");
      const auto vocab = size();
      expect(", ctx=");
      const auto ctx = size();
      expect(", embd=");
      const auto embd = size();
      expect(")");
      count_params(vocab * embd);
      count_params(ctx * embd);
      return dry_ ? nullptr : make_embedding(vocab, ctx, embd);
    }
    if (name == "attention") {
      expect("(");
      const auto embd = size();
      expect(", heads=");
      const auto heads = size();
      expect(", ctx=");
      const auto ctx = size();
      expect(")");
      if (embd % heads != 0) fail("embd must be a multiple of heads");
      count_params(3 * embd * embd + 3 * embd);
      count_params(embd * embd + embd);
      return dry_ ? nullptr : make_attention(embd, heads, ctx);
    }
    if (name == "layer_norm") {
      expect("(");
      const auto n = size();
      float eps = 1e-5f;
      if (eat(", eps=")) eps = number();
      expect(")");
      if (!(eps > 0)) fail("eps must be positive");
      count_params(2 * n);
      return dry_ ? nullptr : make_layer_norm(n, eps);
    }
    if (name == "dropout") {
      expect("(");
      const float p = number();
      expect(")");
      if (!(p >= 0.0f && p < 1.0f)) fail("a dropout probability must be in [0, 1)");
      return dry_ ? nullptr : make_dropout(p);
    }
    if (name == "residual") {
      expect("(");
      auto inner = next_layer(depth + 1);
      expect(")");
      return dry_ ? nullptr : make_residual(std::move(inner));
    }
    if (name == "sequential") {
      expect("(");
      auto seq = dry_ ? nullptr : std::make_unique<sequential>();
      if (!eat(")")) {
        do {
          auto l = next_layer(depth + 1);
          if (seq) seq->add(std::move(l));
        } while (eat(", "));
        expect(")");
      }
      return seq;
    }
    fail(name.empty() ? std::string("expected a layer") : "'" + std::string(name) + "' is not a layer troupe knows");
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::int64_t params_ = 0;
  bool dry_ = false;
};

}  // namespace

std::unique_ptr<layer> make_layer(std::string_view description) {
  return description_reader(description).whole();
}

std::int64_t parameter_count(std::string_view description) { return description_reader(description).parameters(); }

std::unique_ptr<sequential> make_mlp(const std::string& spec) {
  const auto sizes = mlp_sizes(spec);
  auto m = std::make_unique<sequential>();
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    if (i) m->add(make_relu());
    m->add(make_linear(sizes[i], sizes[i + 1]));
  }
  return m;
}

}  // namespace troupe::kernels
