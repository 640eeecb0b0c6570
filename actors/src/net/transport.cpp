#include "net/transport.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>

#include "troupe/core/error.hpp"
#include "troupe/core/log.hpp"

namespace troupe::net {

namespace {

constexpr std::string_view client_label = "troupe client";
constexpr std::string_view server_label = "troupe server";

// Before the handshake a peer may only send the small handshake envelopes.
wire_limits handshake_limits(const wire_limits& after) {
  wire_limits l = after;
  l.max_envelope_bytes = std::min<std::uint32_t>(after.max_envelope_bytes, 1024);
  l.max_frame_bytes = std::min<std::uint64_t>(after.max_frame_bytes, 2048);
  l.max_error_message = 0;
  return l;
}


bool same_proof(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

envelope control(control_code code, std::vector<std::byte> payload = {}) {
  envelope e;
  e.kind = envelope_kind::control;
  e.method = static_cast<std::uint64_t>(code);
  e.payload = std::move(payload);
  return e;
}

constexpr std::size_t read_chunk = 64u << 10;
/// Before the handshake a connection reads through a small buffer: many unauthenticated
/// connections cost little memory while they wait for their handshake's deadline.
constexpr std::size_t handshake_read_chunk = 4u << 10;
// Frames closer together than this are batched rather than written one system call each.
constexpr auto direct_write_gap = std::chrono::microseconds(20);

}  // namespace

std::vector<std::byte> random_nonce() {
  std::vector<std::byte> n(nonce_bytes);
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1)
    throw error(errc::connection_lost, "the random generator failed");
  return n;
}

std::vector<std::byte> handshake_proof(std::string_view token, std::string_view label,
                                       std::span<const std::byte> nonce) {
  std::vector<unsigned char> msg(label.begin(), label.end());
  const auto* p = reinterpret_cast<const unsigned char*>(nonce.data());
  msg.insert(msg.end(), p, p + nonce.size());
  std::vector<std::byte> out(proof_bytes);
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), msg.data(), msg.size(),
           reinterpret_cast<unsigned char*>(out.data()), &len) == nullptr ||
      len != proof_bytes)
    throw error(errc::connection_lost, "HMAC-SHA256 failed");
  return out;
}

// ---- connection ----------------------------------------------------------------------------

connection::connection(transport& owner, tcp::socket socket, bool outbound, std::uint64_t id,
                       std::uint64_t tag)
    : owner_(owner),
      socket_(std::move(socket)),
      deadline_(socket_.get_executor()),
      outbound_(outbound),
      id_(id),
      tag_(tag),
      decoder_(handshake_limits(owner.config().limits)),
      read_buf_(handshake_read_chunk) {
  fd_ = socket_.native_handle();
  if (owner.tls_) tls_ = std::make_unique<asio::ssl::stream<tcp::socket&>>(socket_, *owner.tls_);
}

connection::~connection() = default;

void connection::start() {
  boost::system::error_code ec;
  if (owner_.config().no_delay) socket_.set_option(tcp::no_delay(true), ec);
  deadline_.expires_after(owner_.config().handshake_timeout);
  deadline_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->authenticated() || self->closed_) return;
    std::string why = "handshake timed out";
    if (self->tls_ && !self->tls_done_)
      why += " (no TLS hello from the peer: a node without TLS waits silently; give every node the same TLS settings)";
    else if (!self->tls_ && self->frames_received() == 0 && self->outbound_)
      why += " (the peer sent nothing: if it uses TLS, give this node the same TLS settings)";
    self->do_close(std::move(why), true);
  });
  if (!tls_) return begin_handshake();
  tls_->async_handshake(outbound_ ? asio::ssl::stream_base::client : asio::ssl::stream_base::server,
                        [self = shared_from_this()](boost::system::error_code ec) {
                          if (self->closed_) return;
                          if (ec) {
                            std::string why = "TLS handshake failed: " + ec.message();
                            if (ec.category() == asio::error::get_ssl_category() &&
                                ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_WRONG_VERSION_NUMBER)
                              why += " (the peer does not speak TLS: give every node the same TLS settings)";
                            else if (ec == asio::ssl::error::stream_truncated)
                              why += " (the peer left before its TLS hello: does it run without TLS? give every node the same TLS settings)";
                            return self->do_close(std::move(why), true);
                          }
                          self->tls_done_ = true;
                          self->begin_handshake();
                        });
}

void connection::begin_handshake() {
  if (!outbound_) {
    nonce_ = random_nonce();
    send_now(control(control_code::challenge, nonce_));
  }
  read_more();
}

template <class Buffers, class Handler>
void connection::read_some(const Buffers& b, Handler&& h) {
  if (tls_) tls_->async_read_some(b, std::forward<Handler>(h));
  else socket_.async_read_some(b, std::forward<Handler>(h));
}

void connection::send(envelope env) {
  // Encoded on the sender's thread; written from it too when nothing else is being written.
  auto frame = encode_frame(std::move(env));
  std::lock_guard lock(write_mutex_);
  if (write_closed_ || closing_) return;
  if (!authenticated()) {
    held_.push_back(std::move(frame));
    return;
  }
  enqueue(std::move(frame));
}

void connection::close(std::string reason) {
  asio::post(socket_.get_executor(), [self = shared_from_this(), reason = std::move(reason)]() mutable {
    self->do_close(std::move(reason));
  });
}

void connection::refuse(std::string reason) {
  // Closing from now on (on_read reads nothing more), the refusal queued behind what was sent;
  // the close itself runs on the strand.
  const auto said = reason.substr(0, max_refusal_bytes);
  if (!begin_refusal(std::move(reason), {reinterpret_cast<const std::byte*>(said.data()),
                                         reinterpret_cast<const std::byte*>(said.data()) + said.size()}))
    return;
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close_if_written(); });
}

bool connection::begin_refusal(std::string reason, std::vector<std::byte> said) {
  std::lock_guard lock(write_mutex_);
  if (closing_) return false;
  closing_ = true;
  closing_reason_ = std::move(reason);
  if (!write_closed_) enqueue(encode_frame(control(control_code::refuse, std::move(said))));
  return true;
}

void connection::close_if_written() {
  // Written at once: close now; otherwise write_more closes once the queue is written.
  std::unique_lock lock(write_mutex_);
  if (!writing_now_ && queue_.empty()) {
    lock.unlock();
    do_close(closing_reason_, true);
  }
}

void connection::send_now(envelope env) {
  std::lock_guard lock(write_mutex_);
  if (!write_closed_) enqueue(encode_frame(std::move(env)));
}

void connection::enqueue(outbound_frame f) {
  // Nothing in flight and the last frame left a while ago (calls one at a time): write now,
  // without a hop to the connection's thread. Frames that follow each other closely (many
  // calls in flight) queue instead, and the strand writes them together: fewer system calls.
  // The socket is non-blocking; what the kernel does not take now goes the asynchronous way.
  auto now = std::chrono::steady_clock::now();
  bool direct = !tls_ && !writing_now_ && queue_.empty() && now - last_direct_ > direct_write_gap;
  if (direct) last_direct_ = now;
  if (direct) {
    // Header, envelope and the body's pieces (its own bytes and spliced runs) in one system call.
    std::vector<iovec> iov;
    iov.reserve(2 + 2 * f.body.splices.size());
    f.for_each_piece([&](std::span<const std::byte> p) {
      iov.push_back({const_cast<std::byte*>(p.data()), p.size()});
    });
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = std::min<std::size_t>(iov.size(), IOV_MAX);
    ssize_t n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(f.size())) {
      frames_sent_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      write_closed_ = true;
      asio::post(socket_.get_executor(), [self = shared_from_this(), why = std::string(std::strerror(errno))] {
        self->do_close("write failed: " + why);
      });
      return;
    }
    f.written = n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  queue_.push_back(std::move(f));
  if (!writing_now_) {
    writing_now_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->write_more(); });
  }
}

void connection::write_more() {
  std::vector<asio::const_buffer> buffers;
  {
    std::lock_guard lock(write_mutex_);
    if (write_closed_ || queue_.empty()) {
      writing_now_ = false;
      if (closing_ && !write_closed_) asio::post(socket_.get_executor(), [self = shared_from_this()] {
        self->do_close(self->closing_reason_, true);
      });
      return;
    }
    // Gather everything queued into one write: heads and bodies go out from their own buffers.
    writing_.swap(queue_);
    buffers.reserve(writing_.size() * 2);
    for (const auto& f : writing_) {
      std::size_t skip = f.written;
      f.for_each_piece([&](std::span<const std::byte> part) {
        if (skip >= part.size()) {
          skip -= part.size();
          return;
        }
        buffers.emplace_back(part.data() + skip, part.size() - skip);
        skip = 0;
      });
    }
  }
  auto done = [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
    {
      std::lock_guard lock(self->write_mutex_);
      self->frames_sent_.fetch_add(self->writing_.size(), std::memory_order_relaxed);
      self->writing_.clear();
    }
    if (ec) {
      if (!self->closed_) self->do_close("write failed: " + ec.message());
      return;
    }
    self->write_more();
  };
  if (tls_) asio::async_write(*tls_, buffers, std::move(done));
  else asio::async_write(socket_, buffers, std::move(done));
}

void connection::read_more() {
  if (closed_) return;
  if (read_buf_.size() < read_chunk && authenticated()) read_buf_.resize(read_chunk);
  // A large body is read straight into the payload's own buffer; everything else through
  // the read buffer and the decoder.
  auto body = decoder_.body_space();
  if (body.size() >= read_chunk) {
    read_some(asio::buffer(body.data(), body.size()),
                            [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                              if (ec) {
                                if (!self->closed_) self->do_close(ec == asio::error::eof ? "the peer closed the connection inside a frame" : "read failed: " + ec.message());
                                return;
                              }
                              if (!self->decoder_.commit_body(n)) {
                                self->do_close(std::string(to_string(self->decoder_.error().code)) + ": " + self->decoder_.error().message, true);
                                return;
                              }
                              self->on_read(0);
                            });
    return;
  }
  read_some(asio::buffer(read_buf_),
                          [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                            if (ec) {
                              if (self->closed_) return;
                              if (ec == asio::error::eof && !self->authenticated())
                                self->do_close(self->tls_ ? "the peer closed the connection during the handshake"
                                                          : "the peer closed the connection during the handshake (if it uses TLS, give this node the same TLS settings)");
                              else if (ec == asio::error::eof)
                                self->do_close(self->decoder_.idle() ? "the peer closed the connection"
                                                                     : "the peer closed the connection inside a frame");
                              else
                                self->do_close("read failed: " + ec.message());
                              return;
                            }
                            self->on_read(n);
                          });
}

void connection::on_read(std::size_t n) {
  last_read_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  // A TLS record header (handshake, version 3.x) where the first frame should start.
  if (!tls_ && !authenticated() && frames_received() == 0 && decoder_.idle() && n >= 3 &&
      read_buf_[0] == std::byte{0x16} && read_buf_[1] == std::byte{0x03}) {
    do_close("the peer started a TLS handshake and this node does not use TLS: give every node the same TLS settings", true);
    return;
  }
  if (n != 0 && !decoder_.feed(std::span<const std::byte>(read_buf_.data(), n))) {
    const auto& e = decoder_.error();
    do_close(std::string(to_string(e.code)) + ": " + e.message, true);
    return;
  }
  // A connection refused or closed meanwhile (by another thread too) hands on nothing more.
  while (!closed_ && !closing_now()) {
    auto env = decoder_.pop();
    if (!env) return read_more();
    frames_received_.fetch_add(1, std::memory_order_relaxed);
    on_envelope(std::move(*env));
  }
}

void connection::on_envelope(envelope env) {
  if (!authenticated()) {
    on_handshake(std::move(env));
    return;
  }
  if (env.kind == envelope_kind::control && env.method == static_cast<std::uint64_t>(control_code::refuse)) {
    // The peer closes, and says why (connection::refuse): printable text only goes to the log.
    std::string why;
    for (auto b : std::span(env.payload).first(std::min(env.payload.size(), max_refusal_bytes))) {
      const auto ch = static_cast<char>(b);
      why += ch >= 0x20 && ch < 0x7f ? ch : '?';
    }
    do_close("refused by the peer: " + (why.empty() ? std::string("no reason given") : why), true);
    return;
  }
  if (env.kind == envelope_kind::control &&
      env.method <= static_cast<std::uint64_t>(control_code::refuse)) {
    do_close("a handshake envelope after the handshake", true);
    return;
  }
  if (owner_.handlers_.on_envelope) owner_.handlers_.on_envelope(shared_from_this(), std::move(env));
}

bool connection::on_handshake(envelope env) {
  const auto& token = owner_.config().token;
  auto expect = [&](control_code code) {
    return env.kind == envelope_kind::control && env.method == static_cast<std::uint64_t>(code);
  };
  if (outbound_) {
    if (nonce_.empty()) {
      // Waiting for the challenge.
      if (!expect(control_code::challenge) || env.payload.size() != nonce_bytes) {
        do_close("expected the handshake challenge, got a " + std::string(to_string(env.kind)) + " envelope", true);
        return false;
      }
      nonce_ = random_nonce();
      auto proof = handshake_proof(token, client_label, env.payload);
      proof.insert(proof.end(), nonce_.begin(), nonce_.end());
      send_now(control(control_code::response, std::move(proof)));
      return true;
    }
    if (expect(control_code::refuse)) {
      do_close("refused by the peer: wrong cluster token", true);
      return false;
    }
    if (!expect(control_code::accept) ||
        !same_proof(env.payload, handshake_proof(token, server_label, nonce_))) {
      do_close("the peer did not prove the cluster token", true);
      return false;
    }
    finish_handshake();
    return true;
  }
  if (!expect(control_code::response) || env.payload.size() != proof_bytes + nonce_bytes) {
    do_close("expected the handshake response, got a " + std::string(to_string(env.kind)) + " envelope", true);
    return false;
  }
  auto payload = std::span<const std::byte>(env.payload);
  if (!same_proof(payload.first(proof_bytes), handshake_proof(token, client_label, nonce_))) {
    // Tell the peer why, then close once the refusal is written; read nothing more.
    if (begin_refusal("wrong cluster token", {})) close_if_written();
    return false;
  }
  send_now(control(control_code::accept, handshake_proof(token, server_label, payload.subspan(proof_bytes))));
  finish_handshake();
  return true;
}

void connection::finish_handshake() {
  deadline_.cancel();
  decoder_.set_limits(owner_.config().limits);
  {
    // What was sent before the handshake goes first; later sends queue behind it.
    std::lock_guard lock(write_mutex_);
    authenticated_.store(true, std::memory_order_release);
    for (auto& f : held_)
      if (!write_closed_) enqueue(std::move(f));
    held_.clear();
  }
  if (owner_.handlers_.on_open) owner_.handlers_.on_open(shared_from_this());
}

void connection::do_close(std::string reason, bool refused) {
  if (closed_) return;
  closed_ = true;
  open_.store(false, std::memory_order_release);
  if (refused)
    log().warn("troupe net: connection {} closed: {}", id_, reason);
  else
    log().info("troupe net: connection {} closed: {}", id_, reason);
  boost::system::error_code ignored;
  deadline_.cancel();
  {
    // Under the write lock: no sender is inside sendmsg on this descriptor when it closes.
    std::lock_guard lock(write_mutex_);
    write_closed_ = true;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    queue_.clear();
    held_.clear();
  }
  owner_.closed(shared_from_this(), reason);
}

// ---- transport -----------------------------------------------------------------------------

transport::transport(asio::io_context& io, transport_config config, transport_handlers handlers)
    : io_(io), config_(std::move(config)), handlers_(std::move(handlers)) {
  if (config_.token.empty())
    throw error(errc::connection_lost, "a transport needs a cluster token (an empty one is refused)");
  if (config_.tls.enabled()) {
    auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls);
    ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                     asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                     asio::ssl::context::no_tlsv1_1);
    auto load = [&](const char* what, const std::string& file, auto&& fn) {
      boost::system::error_code ec;
      fn(ec);
      if (ec) throw std::invalid_argument(std::string("TLS ") + what + " '" + file + "': " + ec.message());
    };
    load("certificate", config_.tls.certificate,
         [&](auto& ec) { ctx->use_certificate_chain_file(config_.tls.certificate, ec); });
    if (config_.tls.private_key.empty())
      throw std::invalid_argument("TLS needs the certificate's private key too");
    load("private key", config_.tls.private_key,
         [&](auto& ec) { ctx->use_private_key_file(config_.tls.private_key, asio::ssl::context::pem, ec); });
    if (!config_.tls.ca.empty()) {
      load("CA file", config_.tls.ca, [&](auto& ec) { ctx->load_verify_file(config_.tls.ca, ec); });
      ctx->set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
    }
    tls_ = std::move(ctx);
  }
}

transport::~transport() {
  boost::system::error_code ignored;
  if (acceptor_) acceptor_->close(ignored);
  std::lock_guard lock(mutex_);
  for (auto& [id, c] : connections_) {
    c->closed_ = true;
    c->open_.store(false);
    c->deadline_.cancel();
    c->socket_.close(ignored);
  }
}

std::uint16_t transport::listen(const std::string& address, std::uint16_t port) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  if (ec)
    throw std::invalid_argument("'" + address + "' is not an IP address (write it as digits, e.g. 127.0.0.1 or ::1)");
  auto acc = std::make_unique<asio::ip::tcp::acceptor>(asio::make_strand(io_));
  asio::ip::tcp::endpoint ep(addr, port);
  acc->open(ep.protocol(), ec);
  if (!ec) acc->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acc->bind(ep, ec);
  if (!ec) acc->listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw error(errc::connection_lost,
                "cannot listen on " + address + ":" + std::to_string(port) + ": " + ec.message());
  acceptor_ = std::move(acc);
  auto bound = acceptor_->local_endpoint().port();
  accept_next();
  return bound;
}

namespace {
constexpr std::chrono::milliseconds accept_retry{50};
}  // namespace

void transport::accept_next() {
  acceptor_->async_accept(asio::make_strand(io_), [this, alive = std::weak_ptr<bool>(alive_)](
                                                      boost::system::error_code ec, asio::ip::tcp::socket s) {
    if (alive.expired() || !acceptor_ || !acceptor_->is_open()) return;
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      if (accept_failures_ > 1) log().info("troupe net: accepting again after {} failed accepts", accept_failures_);
      accept_failures_ = 0;
      adopt(std::move(s), false, 0);
      accept_next();
      return;
    }
    // Out of descriptors (or another error that retrying at once cannot fix): wait a little
    // before the next accept, and log the first failure only, instead of spinning a core and
    // flooding the log while the condition lasts.
    if (accept_failures_++ == 0)
      log().warn("troupe net: accept failed: {} (retrying every {} ms; further failures are counted)", ec.message(),
                 accept_retry.count());
    auto timer = std::make_shared<asio::steady_timer>(acceptor_->get_executor(), accept_retry);
    timer->async_wait([this, timer, alive](boost::system::error_code wait_ec) {
      if (alive.expired() || wait_ec || !acceptor_ || !acceptor_->is_open()) return;
      accept_next();
    });
  });
}

void transport::connect(const std::string& host, std::uint16_t port, std::uint64_t tag,
                        std::function<void(const std::string&)> on_fail) {
  auto resolver = std::make_shared<asio::ip::tcp::resolver>(io_);
  auto socket = std::make_shared<asio::ip::tcp::socket>(asio::make_strand(io_));
  resolver->async_resolve(
      host, std::to_string(port),
      [this, resolver, socket, host, port, tag, on_fail = std::move(on_fail),
       alive = std::weak_ptr<bool>(alive_)](boost::system::error_code ec,
                                            asio::ip::tcp::resolver::results_type results) {
        if (alive.expired()) return;
        // By value: it runs again from the connect handler, after this one has returned.
        auto fail = [this, host, port, on_fail](const std::string& why) {
          auto reason = "cannot connect to " + host + ":" + std::to_string(port) + ": " + why;
          if (on_fail) return on_fail(reason);
          log().warn("troupe net: {}", reason);
          if (handlers_.on_close) handlers_.on_close(nullptr, reason);
        };
        if (ec) return fail(ec.message());
        asio::async_connect(*socket, results,
                            [this, socket, fail, tag, alive](boost::system::error_code ec, const asio::ip::tcp::endpoint&) {
                              if (alive.expired()) return;
                              if (ec) return fail(ec.message());
                              adopt(std::move(*socket), true, tag);
                            });
      });
}

void transport::adopt(asio::ip::tcp::socket socket, bool outbound, std::uint64_t tag) {
  std::shared_ptr<connection> c;
  boost::system::error_code ec;
  auto local = socket.local_endpoint(ec);
  auto remote = socket.remote_endpoint(ec);
  {
    std::lock_guard lock(mutex_);
    c = std::shared_ptr<connection>(
        new connection(*this, std::move(socket), outbound, next_id_++, tag));
    c->local_host_ = local.address().to_string();
    c->remote_host_ = remote.address().to_string();
    connections_.emplace(c->id(), c);
  }
  // The connection's first steps run on its own strand.
  asio::post(c->socket_.get_executor(), [c] {
    try {
      c->start();
    } catch (const std::exception& e) {
      c->do_close(e.what());
    }
  });
}

void transport::closed(const std::shared_ptr<connection>& c, const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    connections_.erase(c->id());
  }
  if (handlers_.on_close) handlers_.on_close(c, reason);
}

void transport::close_all(const std::string& reason) {
  // The acceptor lives on its own strand: close it there, never beside its accept handler.
  if (acceptor_)
    asio::post(acceptor_->get_executor(), [this, alive = std::weak_ptr<bool>(alive_)] {
      if (alive.expired()) return;
      boost::system::error_code ignored;
      acceptor_->close(ignored);
    });
  std::vector<std::shared_ptr<connection>> all;
  {
    std::lock_guard lock(mutex_);
    for (auto& [id, c] : connections_) all.push_back(c);
  }
  for (auto& c : all) c->close(reason);
}

std::size_t transport::connections() const {
  std::lock_guard lock(mutex_);
  return connections_.size();
}

}  // namespace troupe::net
