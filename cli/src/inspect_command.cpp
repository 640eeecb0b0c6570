// `troupe inspect`: examine a saved model. `inspect neural-cleanse` looks for a backdoor's target
// label (federated/neural_cleanse.hpp).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <troupe/federated/neural_cleanse.hpp>
#include <troupe/kernels/data.hpp>

#include "commands.hpp"

namespace troupe::cli {

namespace {

struct neural_cleanse_cli {
  std::string load, model, data_dir, data;
  bool json = false;
  int early_stop_patience = -1;  // -1: 5 x --patience
  troupe::federated::neural_cleanse_options o;
};

/// The model `troupe train` saves when given no --model.
constexpr const char* train_default_model = "mlp:784-256-128-10";

int run_neural_cleanse(const neural_cleanse_cli& c) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string spec = c.model;
  if (spec.empty() && fs::is_regular_file(c.load, ec)) spec = train_default_model;
  auto model = troupe::federated::load_saved_model(c.load, spec);
  labelled_data data;
  if (c.data.empty())
    data = load_fashion_mnist(c.data_dir.empty() ? fashion_mnist_dir : c.data_dir);
  else if (c.data.rfind("npz:", 0) == 0)
    data = load_npz(c.data.substr(4));
  else if (c.data.rfind("idx:", 0) == 0)
    data = load_idx_dir(c.data.substr(4));
  else
    throw std::invalid_argument("--data " + c.data + ": use npz:FILE or idx:DIR");
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = troupe::federated::neural_cleanse(*model, data, c.o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (c.json) {
    std::string out = "{\"model\":\"" + model->describe() + "\",\"images\":" +
                      std::to_string(std::min<std::int64_t>(c.o.images, data.test.size())) + ",\"labels\":[";
    for (std::size_t t = 0; t < r.triggers.size(); ++t) {
      const auto& tr = r.triggers[t];
      out += (t ? "," : "") + std::string("{\"label\":") + std::to_string(tr.label) +
             ",\"l1\":" + json_number(tr.l1, "%.4f") + ",\"anomaly_index\":" + json_number(r.anomaly.index[t], "%.4f") +
             ",\"attack_success\":" + json_number(tr.attack_success, "%.4f") +
             ",\"reached\":" + (tr.reached ? "true" : "false") + ",\"epochs\":" + std::to_string(tr.epochs) + "}";
    }
    out += "],\"median\":" + json_number(r.anomaly.median, "%.4f") + ",\"mad\":" + json_number(r.anomaly.mad, "%.4f") +
           ",\"flagged\":[";
    for (std::size_t i = 0; i < r.anomaly.flagged.size(); ++i)
      out += (i ? "," : "") + std::to_string(r.anomaly.flagged[i]);
    out += "],\"seconds\":" + json_number(seconds, "%.2f") + "}";
    std::cout << out << "\n";
    return 0;
  }
  std::cout << "neural cleanse of " << model->describe() << " on " << std::min<std::int64_t>(c.o.images, data.test.size())
            << " clean test images (" << seconds << " s)\n";
  std::cout << "label  mask L1   anomaly index  attack success  epochs\n";
  for (std::size_t t = 0; t < r.triggers.size(); ++t) {
    const auto& tr = r.triggers[t];
    char line[160];
    std::snprintf(line, sizeof line, "%5d  %8.2f  %13.2f  %14.3f  %6d%s%s\n", tr.label, tr.l1, r.anomaly.index[t],
                  tr.attack_success, tr.epochs, tr.reached ? "" : "  (threshold not reached)",
                  std::find(r.anomaly.flagged.begin(), r.anomaly.flagged.end(), tr.label) != r.anomaly.flagged.end()
                      ? "  <- flagged"
                      : "");
    std::cout << line;
  }
  std::cout << "median " << r.anomaly.median << ", MAD " << r.anomaly.mad << "; ";
  if (r.anomaly.flagged.empty()) {
    std::cout << "no label flagged (none has an anomaly index above " << c.o.anomaly_threshold << " below the median)\n";
  } else {
    std::cout << "flagged (a backdoor's likely target):";
    for (int t : r.anomaly.flagged) std::cout << " " << t;
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, int& rc) {
  auto* inspect = app.add_subcommand("inspect", "examine a saved model");
  inspect->require_subcommand(1);
  auto c = std::make_shared<neural_cleanse_cli>();
  auto* nc = inspect->add_subcommand(
      "neural-cleanse", "Neural Cleanse (Wang et al., 2019): the smallest trigger per label, the labels it flags as backdoored");
  nc->add_option("--load", c->load, "a `troupe fedsim --checkpoint` directory or a `troupe train --save` weights file")
      ->required();
  nc->add_option("--model", c->model,
                 "the model of a weights file (default: troupe train's, mlp:784-256-128-10); a checkpoint names its own");
  nc->add_option("--data-dir", c->data_dir, "where the Fashion-MNIST files are (default: their Debian location)");
  nc->add_option("--data", c->data, "npz:FILE or idx:DIR: your own u8 images (their test split is used)");
  nc->add_option("--images", c->o.images, "clean test images the triggers must flip")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  nc->add_option("--batch", c->o.batch, "images per step")->capture_default_str()->check(CLI::Range(1, 100000));
  nc->add_option("--epochs", c->o.epochs, "at most, per label")->capture_default_str()->check(CLI::Range(1, 100000));
  nc->add_option("--steps-per-epoch", c->o.steps_per_epoch, "steps between two looks at the cost (0: images / batch)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  nc->add_option("--lr", c->o.lr, "Adam's learning rate")->capture_default_str()->check(positive_number);
  nc->add_option("--init-cost", c->o.init_cost, "lambda once a trigger first succeeds")
      ->capture_default_str()
      ->check(positive_number);
  nc->add_option("--patience", c->o.patience, "epochs before lambda changes")->capture_default_str()->check(CLI::Range(1, 10000));
  nc->add_option("--early-stop-patience", c->early_stop_patience,
                 "epochs without a smaller mask before a label stops (default 5 x --patience; 0: run every --epochs)")
      ->check(CLI::Range(0, 100000));
  nc->add_option("--threshold", c->o.anomaly_threshold, "flag labels whose anomaly index is above it")
      ->capture_default_str()
      ->check(positive_number);
  nc->add_option("--seed", c->o.seed, "the masks' initial values and the batches' order")->capture_default_str();
  nc->add_flag("--json", c->json, "one JSON object");
  nc->callback([c, &rc] {
    c->o.early_stop_patience = c->early_stop_patience >= 0 ? c->early_stop_patience : 5 * c->o.patience;
    rc = run_neural_cleanse(*c);
  });
}

}  // namespace troupe::cli
