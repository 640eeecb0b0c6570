#pragma once
/// @file
/// Secure aggregation: the server learns the sum of the clients' updates and nothing about any
/// single one. SecAgg+ (Bell et al., CCS 2020) over a k-regular communication graph; full-graph
/// SecAgg (Bonawitz et al., CCS 2017) is the same protocol with every client a neighbour of every
/// other (`config::full_graph`).
///
/// Cryptography from OpenSSL's libcrypto: X25519 key agreement, AES-256-GCM boxes for the shares
/// the server relays, SHA-256 to derive seeds and box keys, and AES-128-CTR as the mask generator
/// (mask generation was most of the protocol's cost; on AES-NI machines OpenSSL's AES-128-CTR
/// outruns its ChaCha20, 5-8 against 3.8 GB/s, and apply_masks' VAES path makes 16-18 GB/s with
/// the additions). Shamir secret sharing over the prime field GF(2^61 - 1) splits each client's
/// mask key and self-mask seed among its neighbours, t of which reconstruct them.
///
/// One round, with the messages as types (the server only ever holds what these carry):
///   1. advertise: every client sends two public keys (for encrypting shares, for masks).
///   2. share: every client receives its neighbours' keys, draws its self-mask seed b, and sends
///      one encrypted share of (mask secret key, b) per neighbour, which the server relays.
///   3. mask: every client adds to its fixed-point encoded input the self mask PRG(b) and, for
///      each neighbour j that shared, ±PRG(agreed key with j) (+ when its id is below j's); the
///      pairwise masks cancel in the sum. The server adds the masked vectors as they arrive.
///   4. unmask: the server names who sent a masked input (survivors) and who shared but did not
///      (dropped); each remaining client returns its share of b for survivors and of the mask key
///      for dropped ones, never both for one client. With t shares the server removes the self
///      masks of survivors and the pairwise masks that survivors shared with dropped clients.
/// A client lost after step 3 still counts in the sum, exactly: the arithmetic is mod 2^32 on
/// integers. Threat model: honest-but-curious server and clients (no signatures on the keys).
///
/// Encoding: each coordinate is clipped to [-clip, clip] and rounded to a signed fixed-point
/// integer with a scale chosen so that the sum of the round's inputs cannot wrap: the largest
/// power of two with sum_bound * scale + max_clients / 2 < 2^31 (each input's rounding may add
/// half a unit), sum_bound being max_clients * clip unless the caller knows a smaller bound on
/// the sum (weighted inputs, most of them far below clip).

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace troupe::federated::secagg {

using client_id = std::uint32_t;
using key = std::array<std::uint8_t, 32>;

struct config {
  std::size_t dim = 0;          ///< length of every input vector
  double clip = 1.0;            ///< inputs are clipped to [-clip, clip]
  std::size_t max_clients = 0;  ///< the most inputs ever summed (fixes the fixed-point scale)
  /// The largest magnitude any coordinate of the sum of a round's inputs can reach (0:
  /// max_clients * clip). The caller answers for it: a sum beyond it wraps.
  double sum_bound = 0;
  std::size_t degree = 0;       ///< neighbours per client (even; 0: 2 ceil(log2 clients))
  std::size_t threshold = 0;    ///< shares that reconstruct a secret (0: degree / 2 + 1)
  bool full_graph = false;      ///< SecAgg (Bonawitz et al.): every client a neighbour of all

  /// The fixed-point scale: the largest power of two with sum_bound * scale < 2^31 (sum_bound
  /// 0: max_clients * clip). Throws std::invalid_argument for a clip that is not positive and
  /// finite, max_clients 0, a sum_bound that is negative or not finite, or a bound too large.
  double scale() const;
};

/// The communication graph over the participating clients: a Harary graph H(k, n) (each client
/// joined to the k/2 nearest on each side of a ring in id order), or the complete graph.
/// Throws std::invalid_argument for fewer than two clients, duplicate ids, an odd or too large
/// degree, or a threshold outside [1, degree].
class graph {
public:
  graph(std::vector<client_id> clients, const config& cfg);
  const std::vector<client_id>& neighbours(client_id id) const;
  const std::vector<client_id>& clients() const noexcept { return clients_; }
  std::size_t degree() const noexcept { return degree_; }
  std::size_t threshold() const noexcept { return threshold_; }

private:
  std::vector<client_id> clients_;
  std::map<client_id, std::vector<client_id>> neighbours_;
  std::size_t degree_, threshold_;
};

// ---- messages ------------------------------------------------------------------------------------

struct public_keys {
  client_id id;
  key encryption;  ///< for the boxes that carry shares
  key masking;     ///< for the pairwise masks
};

struct encrypted_share {
  client_id from, to;
  std::vector<std::uint8_t> box;  ///< nonce followed by the authenticated ciphertext
};

struct masked_input {
  client_id id;
  std::vector<std::uint32_t> values;
};

struct unmask_request {
  std::vector<client_id> survivors;  ///< sent a masked input
  std::vector<client_id> dropped;    ///< shared keys, sent no masked input
};

/// A Shamir share of one 32-byte secret: its x and five field elements.
struct share {
  std::uint64_t x = 0;
  std::array<std::uint64_t, 5> y{};
};

struct unmask_response {
  client_id from;
  std::vector<std::pair<client_id, share>> self_mask_shares;  ///< for survivors
  std::vector<std::pair<client_id, share>> mask_key_shares;   ///< for dropped clients
};

// ---- parties -------------------------------------------------------------------------------------

/// One client's side of one round. Throws std::invalid_argument on a message that does not fit the
/// round (a box that fails authentication, a share from a non-neighbour, a request naming a
/// client as both survivor and dropped, an input of the wrong length).
class client {
public:
  client(client_id id, const config& cfg, const graph& g);
  ~client();
  client(client&&) noexcept;
  client& operator=(client&&) noexcept;

  public_keys advertise();
  /// From the neighbours' advertised keys (others are ignored), one box per neighbour.
  std::vector<encrypted_share> share_keys(std::span<const public_keys> neighbours);
  /// Opens the boxes addressed to this client and masks `input` (dim values). The result's
  /// values reuse `storage`'s memory when it has the capacity.
  masked_input mask(std::span<const encrypted_share> received, std::span<const float> input,
                    std::vector<std::uint32_t> storage = {});
  unmask_response unmask(const unmask_request& request) const;

private:
  struct state;
  std::unique_ptr<state> s_;
};

/// The server's side of one round. It adds masked inputs as they arrive and keeps only the sum.
class server {
public:
  server(const config& cfg, const graph& g);
  ~server();

  void receive_keys(const public_keys& keys);
  /// The advertised keys of `id`'s neighbours.
  std::vector<public_keys> keys_for(client_id id) const;
  void receive_shares(std::span<const encrypted_share> shares);
  /// The boxes addressed to `id`.
  std::vector<encrypted_share> shares_for(client_id id) const;
  void receive_masked(const masked_input& input);
  /// The same, without the message: the sender's id and its masked values.
  void receive_masked(client_id id, std::span<const std::uint32_t> values);
  unmask_request request_unmasking() const;
  void receive_unmask(const unmask_response& response);
  /// The sum of the survivors' (fixed-point) inputs, decoded. Throws std::runtime_error when a
  /// secret cannot be reconstructed (fewer than threshold shares arrived).
  std::vector<float> finish();
  /// The same sum as exact fixed-point integers (what finish() decodes).
  const std::vector<std::int32_t>& integer_sum() const noexcept { return decoded_; }
  std::size_t survivors() const noexcept;

private:
  struct state;
  std::unique_ptr<state> s_;
  std::vector<std::int32_t> decoded_;
};

/// The fixed-point encoding of one input, as clients apply it before masking (for tests and
/// for checking exactness).
std::vector<std::int32_t> encode(std::span<const float> input, const config& cfg);

/// One mask stream: PRG(seed) added to a vector, or subtracted, mod 2^32.
struct mask_term {
  key seed;
  bool subtract = false;
};
/// The mask generator, exposed for tests: values[i] ±= PRG(term.seed)[offset + i] mod 2^32 for
/// every term. PRG(seed) is the AES-128-CTR key stream under the seed's first 16 bytes from a zero
/// counter, read as little-endian 32-bit words; `offset` (a multiple of 4: whole AES blocks)
/// masks a slice of a longer vector. On CPUs with VAES and AVX-512 all the streams are made
/// chunk by chunk while a 16 KiB piece of `values` stays in L1; `reference` forces the plain
/// path (OpenSSL's EVP, one stream after another), which gives the same words. Throws
/// std::invalid_argument for an offset that is not a multiple of 4.
void apply_masks(std::span<std::uint32_t> values, std::span<const mask_term> terms, std::size_t offset = 0,
                 bool reference = false);
/// Whether apply_masks has its fast path (VAES, AVX-512) on this CPU.
bool fast_masks_available() noexcept;

/// Shamir sharing over GF(2^61 - 1), exposed for tests: `count` shares at x = 1..count of which
/// any `threshold` reconstruct the secret.
std::vector<share> split_secret(const key& secret, std::size_t threshold, std::size_t count);
/// Throws std::runtime_error with fewer than `threshold` distinct shares.
key reconstruct_secret(std::span<const share> shares, std::size_t threshold);

}  // namespace troupe::federated::secagg
