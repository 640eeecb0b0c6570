// troupe fedsim --graph knn:K [--graph-hops 0|1|2] [--graph-depth K] [--graph-beta B] [--graph-labelled N]:
// federated graph learning (FedGCN's exchange, then FedAvg of SGC), a line per evaluated round
// and a summary (text or JSON) with the graph's figures, and the refusal of the flags the run
// would otherwise silently ignore.

#include <cstdio>
#include <string>

#include <troupe/federated/graph.hpp>

#include "commands.hpp"
#include "fedsim_graph.hpp"

namespace troupe::cli {

std::string graph_conflict(const CLI::App& cmd) {
  struct conflict {
    const char* flag;
    const char* why;
  };
  static const conflict conflicts[] = {
      {"--vertical", "graph clients hold whole nodes"},
      {"--split", "SGC is one linear layer"},
      {"--decentralized", "FedGCN's exchange goes through a server"},
      {"--topology", "it is read with --decentralized"},
      {"--client-models", "every client trains SGC's linear layer"},
      {"--public", "it is read with --client-models"},
      {"--distill-steps", "it is read with --client-models"},
      {"--model", "SGC's model is a linear layer on the propagated features"},
      {"--partition", "nodes are assigned to clients by --graph-beta"},
      {"--trainer", "the clients train SGC's linear layer (the mlp trainer)"},
      {"--finetune-from", "SGC starts from a fresh linear layer"},
      {"--shift", "the graph is built from the images as they are"},
      {"--lora", "SGC's linear layer is trained whole"},
      {"--lora-agg", "SGC's linear layer is trained whole"},
      {"--lora-alpha", "SGC's linear layer is trained whole"},
      {"--async", "graph runs take synchronous rounds"},
      {"--verify-norm", "the norm proofs are not wired to graph runs"},
      {"--verify-bits", "the norm proofs are not wired to graph runs"},
      {"--checkpoint", "graph runs keep no checkpoints (the graph is built again from the seed)"},
      {"--contribution", "the Shapley values are not wired to graph runs"},
      {"--contributions", "the Shapley values are not wired to graph runs"},
      {"--reward-budget", "the rewards are paid from Shapley values, not wired to graph runs"},
      {"--validation", "it is read with --contribution"},
      {"--coalition-model", "it is read with --contribution"},
      {"--drift", "drift is injected into the image simulation's clients"},
      {"--drift-detect", "drift is detected on the image simulation's clients"},
      {"--drift-response", "drift is answered in the image simulation"},
      {"--attack", "the attacks are not wired to graph clients"},
      {"--report", "the HTML report draws the image simulation's runs"},
  };
  for (const auto& c : conflicts) {
    if (cmd.count(c.flag) == 0) continue;
    if (std::string(c.flag) == "--trainer") {
      const auto* opt = cmd.get_option_no_throw(c.flag);
      if (opt && opt->as<std::string>() == "mlp") continue;
    }
    return std::string(c.flag) + " cannot combine with --graph (" + c.why + ")";
  }
  return {};
}

int run_fedsim_graph(const troupe::federated::simulation_options& o, const graph_flags& f, bool json) {
  troupe::federated::graph_options g;
  g.base = o;
  g.k = troupe::federated::parse_graph_spec(f.graph);
  g.hops = f.hops;
  g.depth = f.depth;
  g.beta = f.beta;
  g.labelled = f.labelled;
  troupe::federated::check_graph_options(g);
  if (!json)
    std::fprintf(stderr, "troupe fedsim: building the %s graph of the images (PCA to %d, cosine), then FedGCN with %d hop%s\n",
                 f.graph.c_str(), g.components, g.hops, g.hops == 1 ? "" : "s");
  auto s = troupe::federated::run_graph(g, [&](const troupe::federated::progress& p) {
    if (!p.evaluated) return;
    std::string extra;
    for (const auto& [name, value] : p.eval.metrics) {
      if (json) {
        extra += ",\"" + name + "\":" + json_number(value, "%.6g");
      } else {
        char buf[96];
        std::snprintf(buf, sizeof buf, "  %s %.4g", name.c_str(), value);
        extra += buf;
      }
    }
    if (json)
      std::printf("{\"round\":%d,\"test_accuracy\":%s,\"test_loss\":%s,\"seconds\":%.3f,\"uplink_bytes\":%llu%s}\n",
                  p.round->round, json_number(p.eval.accuracy, "%.4f").c_str(), json_number(p.eval.loss, "%.4f").c_str(),
                  p.seconds, static_cast<unsigned long long>(p.uplink_bytes), extra.c_str());
    else
      std::printf("round %d/%d  test-node accuracy %.4f  test loss %.4f  train loss %.4f  %.1f s%s\n", p.round->round,
                  p.rounds, p.eval.accuracy, p.eval.loss, p.round->train_loss, p.seconds, extra.c_str());
    std::fflush(stdout);
  });
  const auto& t = s.training;
  const double cross = s.graph_edges ? static_cast<double>(s.cross_client_edges) / static_cast<double>(s.graph_edges) : 0.0;
  if (json)
    std::printf("{\"final_accuracy\":%s,\"acc\":%s,\"final_loss\":%s,\"rounds\":%d,\"clients\":%zu,\"graph\":\"%s\","
                "\"graph_hops\":%d,\"graph_depth\":%d,\"graph_beta\":%s,\"nodes\":%zu,\"labelled_nodes\":%zu,\"test_nodes\":%zu,"
                "\"graph_edges\":%zu,\"cross_client_edges\":%zu,\"cross_client_fraction\":%.4f,\"graph_build_s\":%.2f,"
                "\"fedgcn_s\":%.2f,\"fedgcn_bytes\":%llu,\"uplink_bytes\":%llu,\"model_crc32\":\"%08x\",\"seconds\":%.2f}\n",
                json_number(t.final_accuracy, "%.4f").c_str(), json_number(t.final_accuracy, "%.4f").c_str(),
                json_number(t.final_loss, "%.9g").c_str(), t.rounds, o.clients, f.graph.c_str(), g.hops, g.depth,
                json_number(g.beta, "%.6g").c_str(), s.nodes, s.labelled, s.test_nodes, s.graph_edges, s.cross_client_edges,
                cross, s.graph_build_s, s.fedgcn_s, static_cast<unsigned long long>(s.fedgcn_bytes),
                static_cast<unsigned long long>(t.uplink_bytes), static_cast<unsigned>(t.model_crc32), t.seconds);
  else
    std::printf("final test-node accuracy %.4f after %d rounds (SGC of depth %d, %zu clients, FedGCN %d hops, beta %g); graph of %zu nodes "
                "(%zu labelled), %zu edges, %zu across clients (%.1f%%), built in %.1f s; FedGCN sent %.1f MB in %.1f s; "
                "%.1f s in all\n",
                t.final_accuracy, t.rounds, g.depth, o.clients, g.hops, g.beta, s.nodes, s.labelled, s.graph_edges,
                s.cross_client_edges, 100 * cross, s.graph_build_s, static_cast<double>(s.fedgcn_bytes) / 1e6, s.fedgcn_s,
                t.seconds);
  return 0;
}

}  // namespace troupe::cli
