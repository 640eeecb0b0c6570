// classifier_stack.hpp: the image trainers' model, optimizer and classifier.

#include "classifier_stack.hpp"

#include <stdexcept>
#include <utility>
#include <vector>

#include "engine.hpp"

namespace troupe::federated::detail {

classifier_stack::classifier_stack(const simulation_options& o, int pixels, int classes, bool on_device)
    : spec(o.model), finetune_from(o.finetune_from), model(make_model(o.model)) {
  if (on_device)
    if (const device where = parse_device(o.device); !where.is_cpu()) kernels::move_to(*model, where);
  kernels::hyperparameters hp;
  hp.lr = o.lr;
  kernels::state_options state;
  state.storage = kernels::parse_state_storage(o.client_state);
  opt = std::make_unique<kernels::optimizer>(kernels::parse_optimizer_kind(o.client_optimizer),
                                             std::vector<kernels::param_group>{{model->parameters(), hp, state}});
  try {
    net = std::make_unique<kernels::classifier>(*model, *opt, pixels);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("model '" + spec + "': " + e.what() + " (the images have " + std::to_string(pixels) +
                                " pixels)");
  }
  if (net->classes() != classes)
    throw std::invalid_argument("model '" + spec + "' has " + std::to_string(net->classes()) + " outputs; the data has " +
                                std::to_string(classes) + " classes");
}

void classifier_stack::initial_weights(std::span<float> out, std::uint64_t seed) const {
  if (!finetune_from.empty()) {
    load_base_model(finetune_from, spec, out);
    return;
  }
  auto fresh = make_model(spec);  // on the host, wherever the trainer's model lives
  fresh->initialize(seed);
  std::size_t at = 0;
  for (auto* p : fresh->parameters())
    for (float v : std::as_const(p->value).data<float>()) out[at++] = v;
}

}  // namespace troupe::federated::detail
