#pragma once
// The TCP transport between troupe nodes (private: Asio never reaches a public header).
//
// Frame layout. Every message is one frame:
//
//   offset  size  field
//        0     4  magic "TRP1" (0x31505254, little-endian)
//        4     2  version (2; a node refuses frames of another version)
//        6     2  flags (bit 0: the payload is the raw body)
//        8     4  envelope length E: a Cap'n Proto segment table and its segments, E % 8 == 0
//       12     4  reserved, zero
//       16     8  body length B (zero unless bit 0 is set)
//       24     E  the envelope (envelope.capnp): kind, target, method, request id, reply-to,
//                 error code and message, and the payload when it is small
//     24+E     B  the raw body: the payload when it is large (inline_payload_limit or more)
//
// A large payload (a tensor's codec bytes) is therefore never copied into the envelope: the
// sender writes header+envelope and the payload's own buffer with one gathered write, and the
// receiver reads the body straight into the vector that becomes `envelope::payload`. Runs spliced
// into the payload (shared_span arguments) are pieces of that gathered write, read from their
// owners' memory (on plain TCP; under TLS, Asio encrypts the gathered buffers into records of
// its own, a copy); the receiver's body buffers come from a pool (wire.hpp, body_pool) and go back
// to it when the payload and every view decoded from it are gone. The
// decoder checks every length against `wire_limits` before it allocates, checks the segment
// table against the bytes present, reads the envelope with Cap'n Proto's traversal and nesting
// limits, and checks the fields (wire.cpp, `validate`). Any error closes that connection only,
// with the reason logged.
//
// Handshake. Joining needs the cluster's token, a shared secret that never crosses the wire:
//
//   server -> client  control(challenge)  payload: a fresh random 32-byte nonce Ns
//   client -> server  control(response)   payload: HMAC-SHA256(token, "troupe client" | Ns) | Nc
//   server -> client  control(accept)     payload: HMAC-SHA256(token, "troupe server" | Nc)
//                 or  control(refuse)     and the server closes
//
// The server compares the proof in constant time and answers with its own proof only after the
// client's is right, so a peer without the token learns nothing it can replay; the client checks
// the server's proof, so it never talks to a node that does not hold the token either. Until its
// side of the handshake is done a connection accepts only the next handshake envelope, under
// small limits (so an unauthenticated peer cannot make a node allocate a large frame), and a
// deadline closes connections that never finish it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "net/wire.hpp"

namespace boost::asio::ssl {
class context;
template <typename Stream>
class stream;
}  // namespace boost::asio::ssl

namespace troupe::net {

namespace asio = boost::asio;

/// Control codes (the `method` of a control envelope).
enum class control_code : std::uint64_t {
  challenge = 1,
  response = 2,
  accept = 3,
  refuse = 4,
};

inline constexpr std::size_t nonce_bytes = 32;
/// The most of a refusal's reason that goes to the peer.
inline constexpr std::size_t max_refusal_bytes = 1024;
inline constexpr std::size_t proof_bytes = 32;

/// nonce_bytes from OpenSSL's generator (handshake nonces, node keys); throws troupe::error
/// when the generator fails.
std::vector<std::byte> random_nonce();

/// HMAC-SHA256(token, label | nonce): the handshake's proof of holding the token.
std::vector<std::byte> handshake_proof(std::string_view token, std::string_view label,
                                       std::span<const std::byte> nonce);

/// TLS through Asio's OpenSSL support. With a certificate set, every connection runs TLS
/// (1.2 or later) before the token handshake, presenting this certificate in both directions;
/// with a CA file, a peer must present a certificate signed by it.
struct tls_config {
  std::string certificate;  ///< PEM file: this node's certificate (chain); empty: no TLS
  std::string private_key;  ///< PEM file: its private key
  std::string ca;           ///< PEM file: the CAs peers' certificates must chain to (empty: any)
  bool enabled() const noexcept { return !certificate.empty(); }
};

struct transport_config {
  std::string token;  ///< the cluster's shared secret; must not be empty
  wire_limits limits;  ///< after the handshake
  std::chrono::milliseconds handshake_timeout{5000};
  bool no_delay = true;  ///< TCP_NODELAY
  tls_config tls;
};

class transport;

/// One authenticated (or authenticating) TCP connection. Created by the transport only.
class connection : public std::enable_shared_from_this<connection> {
public:
  using tcp = asio::ip::tcp;
  ~connection();

  std::uint64_t id() const noexcept { return id_; }
  /// True once both sides have proven the token.
  bool authenticated() const noexcept { return authenticated_.load(std::memory_order_acquire); }
  bool is_open() const noexcept { return open_.load(std::memory_order_acquire); }
  /// Whether this side dialled (client) or accepted (server).
  bool outbound() const noexcept { return outbound_; }
  /// The value given to transport::connect (0 for accepted connections).
  std::uint64_t tag() const noexcept { return tag_; }
  /// This side's and the peer's IP addresses, as text.
  const std::string& local_host() const noexcept { return local_host_; }
  const std::string& remote_host() const noexcept { return remote_host_; }

  /// Queues an envelope; frames leave in the order of `send` calls. @threadsafe
  /// Sending before the handshake is done queues the envelope until it is.
  void send(envelope env);
  /// Closes the connection now (queued frames are dropped); the reason is logged. @threadsafe
  void close(std::string reason);
  /// Closes the connection after telling the peer why (its first max_refusal_bytes, in a
  /// control(refuse) envelope: the peer's connection closes "refused by the peer: REASON");
  /// frames queued before it still go out first, no envelope is handed on after it returns. For
  /// a peer that broke the protocol. @threadsafe
  void refuse(std::string reason);

  /// Frames written and read so far (for statistics and tests).
  std::uint64_t frames_sent() const noexcept { return frames_sent_.load(std::memory_order_relaxed); }
  std::uint64_t frames_received() const noexcept { return frames_received_.load(std::memory_order_relaxed); }
  /// When bytes last arrived (the steady clock's count): a peer in the middle of a large
  /// frame is alive although no whole envelope came for a while.
  std::chrono::steady_clock::time_point last_read() const noexcept {
    return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(last_read_.load(std::memory_order_relaxed)));
  }

private:
  friend class transport;
  connection(transport& owner, tcp::socket socket, bool outbound, std::uint64_t id,
             std::uint64_t tag);

  void start();
  void begin_handshake();  // the token handshake, after TLS when there is TLS
  template <class Buffers, class Handler>
  void read_some(const Buffers& b, Handler&& h);
  void read_more();
  void on_read(std::size_t n);
  void on_envelope(envelope env);
  bool on_handshake(envelope env);
  void send_now(envelope env);
  bool begin_refusal(std::string reason, std::vector<std::byte> said);  // false: closing already
  void close_if_written();  // on the strand
  void enqueue(outbound_frame f);  // under write_mutex_
  void write_more();
  bool closing_now() {
    std::lock_guard lock(write_mutex_);
    return closing_;
  }
  void do_close(std::string reason, bool refused = false);  // refused: logged as a warning
  void finish_handshake();

  transport& owner_;
  tcp::socket socket_;
  asio::steady_timer deadline_;
  std::unique_ptr<asio::ssl::stream<tcp::socket&>> tls_;  // set when the transport uses TLS
  const bool outbound_;
  const std::uint64_t id_;
  const std::uint64_t tag_;
  std::string local_host_;
  std::string remote_host_;
  frame_decoder decoder_;
  std::vector<std::byte> read_buf_;
  std::atomic<std::chrono::steady_clock::rep> last_read_{std::chrono::steady_clock::now().time_since_epoch().count()};
  std::vector<std::byte> nonce_;        // the nonce this side sent
  bool closed_ = false;                 // on the connection's strand
  bool tls_done_ = false;               // the TLS handshake finished (on the strand)
  int fd_ = -1;                         // the socket's descriptor, for writes from any thread
  // The write side, shared by senders on any thread and the strand (write_mutex_ guards it):
  // a sender writes directly when nothing is queued or in flight, else queues; the strand
  // writes the queue in gathered asynchronous writes until it is empty.
  std::mutex write_mutex_;
  std::deque<outbound_frame> queue_;    // waiting to be written
  std::deque<outbound_frame> writing_;  // in the gathered write now in flight
  std::vector<outbound_frame> held_;    // sent before the handshake finished
  bool writing_now_ = false;
  bool write_closed_ = false;
  std::chrono::steady_clock::time_point last_direct_{};
  bool closing_ = false;                // close once the queue is written (a refusal)
  std::string closing_reason_;
  std::atomic<bool> authenticated_{false};
  std::atomic<bool> open_{true};
  std::atomic<std::uint64_t> frames_sent_{0};
  std::atomic<std::uint64_t> frames_received_{0};
};

/// What the transport tells its owner. Called on the io_context's threads, one connection's
/// callbacks never concurrently.
struct transport_handlers {
  /// The handshake succeeded: envelopes may flow.
  std::function<void(const std::shared_ptr<connection>&)> on_open;
  /// An envelope arrived on an authenticated connection.
  std::function<void(const std::shared_ptr<connection>&, envelope)> on_envelope;
  /// The connection closed (for any reason, handshake failures included); a dial that never
  /// reached the peer reports here too, with a null connection.
  std::function<void(const std::shared_ptr<connection>&, const std::string& reason)> on_close;
};

/// Listens and dials over TCP; owns its connections. Runs on the caller's io_context (any number
/// of threads may run it: each connection is serialized on its own strand). `listen` and
/// `connect` are called before or from the io_context's threads; destroy the transport only
/// after the io_context stopped running. The send queues are unbounded for now.
class transport {
public:
  transport(asio::io_context& io, transport_config config, transport_handlers handlers);
  ~transport();
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  /// Listens on `address:port` (port 0: any free port) and returns the bound port.
  /// Throws troupe::error on a bad address or a port in use.
  std::uint16_t listen(const std::string& address, std::uint16_t port);
  /// Dials `host:port`; the result arrives as on_open (the connection carries `tag`), or, when
  /// the peer cannot be reached, as `on_fail(reason)` if given, else on_close with a null
  /// connection.
  void connect(const std::string& host, std::uint16_t port, std::uint64_t tag = 0,
               std::function<void(const std::string&)> on_fail = {});
  /// Stops listening and closes every connection. @threadsafe
  void close_all(const std::string& reason);

  std::size_t connections() const;
  const transport_config& config() const noexcept { return config_; }

private:
  friend class connection;
  void accept_next();
  void adopt(asio::ip::tcp::socket socket, bool outbound, std::uint64_t tag);
  void closed(const std::shared_ptr<connection>& c, const std::string& reason);

  asio::io_context& io_;
  transport_config config_;
  transport_handlers handlers_;
  std::unique_ptr<asio::ip::tcp::acceptor> acceptor_;
  std::uint64_t accept_failures_ = 0;  // in a row (the acceptor's strand only)
  std::unique_ptr<asio::ssl::context> tls_;
  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<connection>> connections_;
  std::uint64_t next_id_ = 1;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace troupe::net
