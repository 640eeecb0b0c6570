#pragma once
/// @file
/// Federated graph learning on a k-nearest-neighbour graph of Fashion-MNIST: SGC (Wu et al.,
/// ICML 2019) trained by FedAvg on features that FedGCN (Yao et al., NeurIPS 2023) aggregates
/// across clients once, before training.
///
///   nodes      all 70,000 images, train and test; `labelled` training images (a seeded choice)
///              carry their labels into training, the test images are unlabelled nodes whose
///              predictions are evaluated (transductive)
///   features   X: the images' 50 principal components (PCA of the normalized pixels through
///              LAPACK, kernels/svd.hpp), each scaled to unit variance
///   graph      each node's k most cosine-similar nodes by those components (ties: the lower
///              index), the products by BLAS in blocks of rows (kernels/gemm.hpp), never the
///              whole n x n; symmetrized (an edge where either names the other), with self
///              loops: Â = D^-1/2 (A + I) D^-1/2, D the degrees of A + I
///   SGC        softmax(Â^K X W), K = `depth` (2 by default): a linear model (one kernels:: linear
///              layer) on Â^K X; K = 0 is the same model without the graph
///   clients    nodes are assigned to clients by Dirichlet(beta) over their labels; each client
///              knows its nodes' features and edges (cross-client edges included)
///   FedGCN     `hops` (0..K) propagations are exchanged: each client sends the server, for
///              every node it knows (its own and their neighbours), the sum of its own nodes'
///              x_j / sqrt(d_j) over that node's closed neighbourhood; the server adds the clients'
///              sums and sends each client those of its own nodes, which it scales by
///              1 / sqrt(d_i): (Â H)_i exactly, whatever the partition. The remaining K - hops
///              propagations run inside each client, on the edges between its own nodes (degrees
///              counted there): hops 0 drops every cross-client edge.
///
/// Exact sums: every term x_j / sqrt(d_j) is rounded once to a fixed-point int64 (units of 2^-32)
/// and the sums are integer, so the order in which clients and the server add them changes no
/// bit: FedGCN's features equal the centralised propagate() bit for bit. The rounding is below
/// 2^-33 per term (propagate_reference, in double without it, is the test's reference).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "troupe/federated/simulation.hpp"

namespace troupe::federated {

// ---- PCA ---------------------------------------------------------------------------------------

/// The leading principal axes of rows of data.
struct pca_basis {
  std::int64_t dims = 0, components = 0;
  std::vector<double> mean;      ///< dims: the rows' mean
  std::vector<double> axes;      ///< components x dims, row-major: orthonormal rows
  std::vector<double> variance;  ///< components, descending: the covariance's eigenvalues
};

/// The `components` leading axes of the `rows` x `dims` row-major `x`: the covariance
/// (x - mean)^T (x - mean) / (rows - 1) by one BLAS product, its eigenvectors by LAPACK's SVD
/// (kernels::svd; for a symmetric positive semi-definite matrix the singular vectors are the
/// eigenvectors). Throws std::invalid_argument for rows < 2, components outside 1..dims or a
/// span of another length.
pca_basis fit_pca(std::span<const float> x, std::int64_t rows, std::int64_t dims, std::int64_t components);

/// (x - mean) axes^T: rows x components, row-major (one BLAS product).
std::vector<float> pca_project(const pca_basis& basis, std::span<const float> x, std::int64_t rows);

// ---- the k-nearest-neighbour graph -------------------------------------------------------------------

/// An undirected graph without self loops: node i's neighbours, ascending, are
/// neighbours[offsets[i], offsets[i + 1]).
struct node_graph {
  std::vector<std::uint64_t> offsets{0};
  std::vector<std::uint32_t> neighbours;
  std::size_t nodes() const noexcept { return offsets.size() - 1; }
  /// Undirected edges (each counted once).
  std::size_t edges() const noexcept { return neighbours.size() / 2; }
  std::span<const std::uint32_t> of(std::size_t i) const {
    return {neighbours.data() + offsets[i], neighbours.data() + offsets[i + 1]};
  }
  /// Degree in A + I (the self loop counted).
  std::size_t degree(std::size_t i) const { return static_cast<std::size_t>(offsets[i + 1] - offsets[i]) + 1; }
};

/// Each row's k most cosine-similar other rows, most similar first (equal similarities: the
/// lower index first): rows x k, row-major. The similarities of a block of rows with every row
/// come from one BLAS product of the unit-length rows (a zero row is similar 0 to every row);
/// blocks run on `threads` threads. Throws std::invalid_argument for k outside 1..rows-1.
std::vector<std::uint32_t> nearest_neighbours(std::span<const float> x, std::int64_t rows, std::int64_t dims, int k,
                                              unsigned threads = 1);

/// The same by brute force in double precision, one pair at a time: the reference.
std::vector<std::uint32_t> nearest_neighbours_reference(std::span<const float> x, std::int64_t rows,
                                                        std::int64_t dims, int k);

/// The k of `scores` (one per index) that rank first by (score descending, index ascending),
/// in that order, `self` left out: the selection both nearest_neighbours use.
std::vector<std::uint32_t> top_k(std::span<const float> scores, std::size_t self, int k);

/// The undirected graph in which i and j are adjacent when either lists the other among its
/// nearest (rows x k, as nearest_neighbours returns them).
node_graph symmetrize(std::span<const std::uint32_t> nearest, std::size_t nodes, int k);

/// Undirected edges whose ends belong to different clients.
std::size_t cross_client_edges(const node_graph& g, std::span<const std::uint32_t> client_of);

// ---- propagation -----------------------------------------------------------------------------

/// Â^depth X (x: nodes x dims, row-major) with exact fixed-point sums (see the file comment).
/// Without `client_of`: over the whole graph. With it: the first `exact_hops` propagations over
/// the whole graph, the rest over the edges inside each client with degrees counted there: the
/// features FedGCN with `exact_hops` exchanged hops gives. Throws std::invalid_argument for a
/// feature whose scaled value reaches 2^16 or a degree above 16384 (the int64 sums could
/// overflow), and for spans of other lengths.
std::vector<float> propagate(const node_graph& g, std::span<const float> x, std::int64_t dims, int depth,
                             std::span<const std::uint32_t> client_of = {}, int exact_hops = 0);

/// Â^depth X over the whole graph in double precision: the reference of propagate.
std::vector<double> propagate_reference(const node_graph& g, std::span<const float> x, std::int64_t dims, int depth);

/// FedGCN's features, by messages between client actors and a server actor on `threads`
/// workers: `exact_hops` exchanges, then depth - exact_hops local propagations. Blocks until
/// done: call it from outside actors. Throws std::invalid_argument as propagate does.
struct fedgcn_features {
  std::vector<float> features;     ///< nodes x dims, each row as its owner computed it
  std::uint64_t uplink_bytes = 0;  ///< what the clients sent (node ids 4 bytes, sums 8 per number)
  std::uint64_t downlink_bytes = 0;
  double seconds = 0;
};
fedgcn_features run_fedgcn(const node_graph& g, std::span<const float> x, std::int64_t dims,
                           std::span<const std::uint32_t> client_of, std::size_t clients, int depth, int exact_hops,
                           unsigned threads = 1);

// ---- the simulation --------------------------------------------------------------------------

/// "knn:K" -> K (1 <= K <= 1000); throws std::invalid_argument for anything else.
int parse_graph_spec(const std::string& spec);

struct graph_options {
  simulation_options base;  ///< clients, rounds, per round, lr, batch, seed, threads, data...
  int k = 10;               ///< --graph knn:K
  int hops = 2;             ///< --graph-hops: FedGCN's exchanged propagations (0..depth)
  double beta = 10000;      ///< --graph-beta: Dirichlet concentration of the nodes' assignment
  std::size_t labelled = 60000;  ///< --graph-labelled: training nodes whose labels train (at most all)
  int depth = 2;            ///< --graph-depth: SGC's K, propagations (Â^depth X); 0: a linear model on X
  int components = 50;      ///< PCA components: the features and the graph's space
};

struct graph_summary {
  std::size_t nodes = 0, labelled = 0, test_nodes = 0;
  std::size_t graph_edges = 0, cross_client_edges = 0;
  double graph_build_s = 0;       ///< PCA and the kNN graph
  double fedgcn_s = 0;            ///< the exchange and the local propagations
  std::uint64_t fedgcn_bytes = 0; ///< the exchange's uplink + downlink
  summary training;               ///< FedAvg of SGC (final_accuracy: on the test nodes)
};

/// Loads Fashion-MNIST (or options.base's data: images of one shape, u8 or f32), builds the
/// graph, assigns the nodes, runs FedGCN and then FedAvg of SGC's weights for base.rounds rounds
/// (`report` after each, as run_simulation reports). Throws std::invalid_argument for options
/// it cannot run.
graph_summary run_graph(const graph_options& options, const std::function<void(const progress&)>& report = {});

/// Checks the options (also what run_graph checks first); throws std::invalid_argument.
void check_graph_options(const graph_options& options);

}  // namespace troupe::federated
