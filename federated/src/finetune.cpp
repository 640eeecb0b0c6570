// Fine-tuning's inputs: the saved model a run starts from (--finetune-from) and the shifted
// data it is fine-tuned on (--shift).

#include <algorithm>
#include <charconv>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "engine.hpp"
#include "troupe/kernels/data.hpp"
#include "troupe/kernels/weights.hpp"

namespace troupe::federated::detail {

namespace {

/// The value of `name=` in a checkpoint's options, or empty.
std::string option_of(const std::string& options, const std::string& name) {
  std::istringstream in(options);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + "=", 0) == 0) return line.substr(name.size() + 1);
  return {};
}

}  // namespace

std::unique_ptr<kernels::sequential> load_model_from(const std::string& path, const std::string& spec, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw std::invalid_argument(flag + " " + path + ": no such file or directory");
  if (fs::is_directory(status)) {
    const std::string file = (fs::path(path) / "fedsim.ckpt").string();
    if (!fs::exists(file, ec))
      throw std::invalid_argument(flag + " " + path +
                                  ": the directory holds no fedsim.ckpt (give a `troupe fedsim --checkpoint` directory or a "
                                  "`troupe train --save` weights file)");
    std::string options;
    std::vector<float> saved;
    try {
      saved = read_checkpoint_model(file, options);
    } catch (const std::runtime_error& e) {
      throw std::invalid_argument(flag + " " + path + ": " + e.what());
    }
    if (!option_of(options, "lora").empty())
      throw std::invalid_argument(flag + " " + path +
                                  ": that checkpoint is of a LoRA run (its model holds adapters beside the weights); "
                                  "use the checkpoint of a run that trained the whole model");
    const std::string saved_model = option_of(options, "model");
    if (!spec.empty() && saved_model != spec)
      throw std::invalid_argument(flag + " " + path + ": the checkpoint holds a model saved with --model " + saved_model +
                                  "; this run has --model " + spec);
    if (!std::all_of(saved.begin(), saved.end(), [](float v) { return std::isfinite(v); }))
      throw std::invalid_argument(flag + " " + path + ": the saved model holds a value that is not finite");
    auto net = make_model(saved_model);
    std::size_t at = 0;
    for (auto* p : net->parameters()) {
      auto v = p->value.data<float>();
      if (at + v.size() > saved.size())
        throw std::invalid_argument(flag + " " + path + ": the checkpoint holds " + std::to_string(saved.size()) +
                                    " floats; --model " + saved_model + " has more");
      std::copy_n(saved.begin() + static_cast<std::ptrdiff_t>(at), v.size(), v.begin());
      at += v.size();
    }
    if (at != saved.size())
      throw std::invalid_argument(flag + " " + path + ": the checkpoint holds " + std::to_string(saved.size()) +
                                  " floats; --model " + saved_model + " has " + std::to_string(at));
    return net;
  }
  // A weights file (troupe train --save): its names and shapes must be those of --model.
  if (spec.empty()) throw std::invalid_argument(flag + " " + path + ": a weights file does not say its model: give --model");
  auto net = make_model(spec);
  try {
    kernels::load_weights(*net, path);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(flag + " " + path + " (for --model " + spec + "): " + e.what());
  }
  return net;
}

void load_base_model(const std::string& path, const std::string& spec, std::span<float> model) {
  const auto net = load_model_from(path, spec, "--finetune-from");
  std::size_t at = 0;
  for (auto* p : net->parameters())
    for (float v : std::as_const(p->value).data<float>()) {
      if (at >= model.size()) throw std::invalid_argument("--finetune-from " + path + ": more parameters than the model");
      model[at++] = v;
    }
  if (at != model.size()) throw std::invalid_argument("--finetune-from " + path + ": fewer parameters than the model");
}

namespace {

/// rot90 of every image of `d` (counter-clockwise, as numpy.rot90): out[i][j] = in[j][side-1-i].
void rotate(dataset& d, std::int64_t side, std::size_t element) {
  const std::int64_t n = d.size();
  tensor out = tensor::empty(d.images.shape(), d.images.type());
  const std::byte* src = d.images.bytes();
  std::byte* dst = out.bytes();
  const std::size_t image = static_cast<std::size_t>(side * side) * element;
  for (std::int64_t k = 0; k < n; ++k) {
    const std::byte* s = src + static_cast<std::size_t>(k) * image;
    std::byte* t = dst + static_cast<std::size_t>(k) * image;
    for (std::int64_t i = 0; i < side; ++i)
      for (std::int64_t j = 0; j < side; ++j)
        std::memcpy(t + static_cast<std::size_t>(i * side + j) * element, s + static_cast<std::size_t>(j * side + (side - 1 - i)) * element,
                    element);
  }
  d.images = std::move(out);
}

void brighten(dataset& d, double c) {
  tensor out = d.images.clone();
  for (std::uint8_t& v : out.data<std::uint8_t>()) v = static_cast<std::uint8_t>(std::clamp(std::round(v * c), 0.0, 255.0));
  d.images = std::move(out);
}

}  // namespace

shared_data shift_data(const shared_data& data, const std::string& spec) {
  labelled_data copy = *data;
  const std::int64_t n = std::max<std::int64_t>(1, copy.train.size());
  const std::int64_t pixels = copy.train.images.numel() / n;
  if (spec == "rot90") {
    const auto side = static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(pixels))));
    if (side * side != pixels)
      throw std::invalid_argument("--shift rot90 turns square images; these have " + std::to_string(pixels) +
                                  " values each, not a square number");
    const auto& shape = copy.train.images.shape();
    if (shape.size() == 3 && shape[1] != shape[2])
      throw std::invalid_argument("--shift rot90 turns square images; these are " + std::to_string(shape[1]) + " x " +
                                  std::to_string(shape[2]));
    const std::size_t element = copy.train.images.type() == dtype::f32 ? 4 : 1;
    rotate(copy.train, side, element);
    rotate(copy.test, side, element);
  } else if (spec.rfind("brightness:", 0) == 0) {
    const std::string v = spec.substr(11);
    double c = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), c);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || !(c >= 0) || !std::isfinite(c) || c > 255)
      throw std::invalid_argument("--shift " + spec + ": C must be a number from 0 to 255 (brightness:0.5 halves every pixel)");
    if (copy.train.images.type() != dtype::u8)
      throw std::invalid_argument("--shift brightness works on u8 pixels; this data holds f32 features");
    brighten(copy.train, c);
    brighten(copy.test, c);
  } else {
    throw std::invalid_argument("unknown --shift '" + spec + "' (use rot90 or brightness:C)");
  }
  return std::make_shared<const labelled_data>(std::move(copy));
}

}  // namespace troupe::federated::detail
