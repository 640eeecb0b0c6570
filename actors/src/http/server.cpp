// The HTTP server of http_server.hpp on Boost.Beast: one io_context on one thread of its own;
// every connection is a session on it, so nothing here needs a lock but the routes' own.
//
// A session reads one request at a time with Beast's parser, bounded (head, fields, body); a
// request past a bound, a malformed one or one over its client's rate gets its error and,
// when the stream can no longer be trusted to be in step (a parse error, a body left unread),
// the connection is closed after the reply: the server sends, shuts its side, reads what the
// client still sends for a moment (so that the client reads the reply rather than a reset),
// then closes. A route that opens an event stream turns the session into a subscriber: the
// response head without a length, then each published event, until the client goes or falls
// more than 1 MiB behind.

#include <array>
#include <atomic>
#include <deque>
#include <stdexcept>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "troupe/actors/http_server.hpp"
#include "troupe/core/log.hpp"

namespace troupe::http {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

constexpr std::size_t max_stream_backlog = 1 << 20;

/// `data` as one server-sent event: a `data:` line per line of it, then a blank line.
std::string format_event(const std::string& data) {
  std::string event;
  event.reserve(data.size() + 16);
  std::size_t start = 0;
  while (start <= data.size()) {
    auto end = data.find('\n', start);
    if (end == std::string::npos) end = data.size();
    event += "data: ";
    event.append(data, start, end - start);
    event += '\n';
    start = end + 1;
  }
  return event + '\n';
}

}  // namespace

class session;

struct server::impl {
  impl(server_config c, const router& r) : cfg(std::move(c)), routes(r), limiter(cfg.requests_per_s, cfg.burst), acceptor(io) {}
  void accept();
  void publish_here(const std::string& event);

  server_config cfg;
  const router& routes;
  rate_limiter limiter;
  std::atomic<std::size_t> connections{0};
  std::atomic<std::size_t> stream_count{0};
  std::vector<std::weak_ptr<session>> streams;  // on the io thread only
  asio::io_context io;
  tcp::acceptor acceptor;
  std::uint16_t port = 0;
  std::thread thread;
};

class session : public std::enable_shared_from_this<session> {
public:
  session(tcp::socket socket, server::impl& srv) : stream_(std::move(socket)), srv_(srv) {
    ++srv_.connections;
    error_code ec;
    auto peer = stream_.socket().remote_endpoint(ec);
    client_ = ec ? "?" : peer.address().to_string();
  }
  ~session() {
    if (streaming_) --srv_.stream_count;
    --srv_.connections;
  }

  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(srv_.cfg.max_head_bytes));
    parser_->body_limit(srv_.cfg.max_body_bytes);
    stream_.expires_after(srv_.cfg.idle_timeout);
    bhttp::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](error_code ec, std::size_t) { self->on_read(ec); });
  }

  /// Queues one formatted event (on the io thread).
  void send_event(const std::string& event) {
    if (closed_) return;
    if (backlog_ + event.size() > max_stream_backlog) {  // a subscriber that does not read
      close();
      return;
    }
    backlog_ += event.size();
    queue_.push_back(event);
    if (!writing_) write_next();
  }

  /// Sends a status with a short text and closes: the answer to a request that cannot be served
  /// on this connection any more (also a connection over the limit, before any read).
  void refuse(unsigned status, std::string text, std::vector<std::pair<std::string, std::string>> more = {}) {
    response r(status, std::move(text) + "\n");
    r.headers = std::move(more);
    write(r, 11, false);
  }

private:
  void on_read(error_code ec) {
    if (ec) {
      if (ec == bhttp::error::body_limit) return refuse(413, "request body too large");
      if (ec == bhttp::error::header_limit) return refuse(431, "request head too large");
      if (ec.category() == bhttp::make_error_code(bhttp::error::bad_target).category() && ec != bhttp::error::end_of_stream &&
          ec != bhttp::error::partial_message)
        return refuse(400, "malformed request");
      return close();  // the client went, or said nothing in time
    }
    auto& req = parser_->get();
    const unsigned version = req.version();
    if (static_cast<std::size_t>(std::distance(req.begin(), req.end())) > srv_.cfg.max_fields)
      return refuse(431, "too many header fields");
    if (!srv_.limiter.allow(client_, rate_limiter::clock::now())) {
      // The request was read whole: the connection stays in step and may go on.
      response r(429, "too many requests\n");
      r.headers = {{"Retry-After", "1"}};
      return write(r, version, req.keep_alive());
    }
    request r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.authorization = std::string(req[bhttp::field::authorization]);
    r.cookie = std::string(req[bhttp::field::cookie]);
    r.content_type = std::string(req[bhttp::field::content_type]);
    r.body = std::move(req.body());
    r.client = client_;
    auto res = srv_.routes.dispatch(r);
    if (res.event_stream && res.status == 200) return open_stream(std::move(res), version);
    write(res, version, req.keep_alive());
  }

  void write(const response& r, unsigned version, bool keep_alive) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(static_cast<bhttp::status>(r.status), version);
    res->set(bhttp::field::server, "troupe");
    res->set(bhttp::field::content_type, r.content_type);
    res->set(bhttp::field::cache_control, "no-store");
    res->set("X-Content-Type-Options", "nosniff");
    for (auto& [k, v] : r.headers) res->insert(k, v);
    res->body() = r.body;
    res->keep_alive(keep_alive);
    res->prepare_payload();
    stream_.expires_after(srv_.cfg.idle_timeout);
    bhttp::async_write(stream_, *res, [self = shared_from_this(), res, keep_alive](error_code ec, std::size_t) {
      if (ec) return self->close();
      if (keep_alive) return self->read();
      self->linger();
    });
  }

  /// Shuts our side and reads (and drops) what the client still sends, for a second at most.
  void linger() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(1));
    drain_ = std::make_shared<std::array<char, 4096>>();
    drain_next();
  }
  void drain_next() {
    stream_.async_read_some(asio::buffer(*drain_), [self = shared_from_this()](error_code ec, std::size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > (1u << 20)) return self->close();
      self->drain_next();
    });
  }

  void open_stream(response res, unsigned version) {
    auto head = std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::ok, version);
    head->set(bhttp::field::server, "troupe");
    head->set(bhttp::field::content_type, "text/event-stream");
    head->set(bhttp::field::cache_control, "no-store");
    head->set("X-Content-Type-Options", "nosniff");
    for (auto& [k, v] : res.headers) head->insert(k, v);
    auto sr = std::make_shared<bhttp::response_serializer<bhttp::empty_body>>(*head);
    stream_.expires_after(srv_.cfg.idle_timeout);
    bhttp::async_write_header(stream_, *sr, [self = shared_from_this(), head, sr, first = std::move(res.body)](error_code ec, std::size_t) {
      if (ec) return self->close();
      self->stream_.expires_never();
      self->streaming_ = true;
      ++self->srv_.stream_count;
      self->srv_.streams.push_back(self);
      if (!first.empty()) self->send_event(format_event(first));
      self->watch_close();
    });
  }

  /// A subscriber says nothing more; a read that ends tells that it went.
  void watch_close() {
    drain_ = std::make_shared<std::array<char, 4096>>();
    stream_.async_read_some(asio::buffer(*drain_), [self = shared_from_this()](error_code ec, std::size_t) {
      if (ec) return self->close();
      self->watch_close();
    });
  }

  void write_next() {
    writing_ = true;
    asio::async_write(stream_, asio::buffer(queue_.front()), [self = shared_from_this()](error_code ec, std::size_t) {
      self->backlog_ -= self->queue_.front().size();
      self->queue_.pop_front();
      if (ec) return self->close();
      if (self->queue_.empty()) self->writing_ = false;
      else self->write_next();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  server::impl& srv_;
  std::string client_;
  beast::flat_buffer buffer_{8192};
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<std::array<char, 4096>> drain_;
  std::size_t drained_ = 0;
  std::deque<std::string> queue_;
  std::size_t backlog_ = 0;
  bool writing_ = false, streaming_ = false, closed_ = false;
};

void server::impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      auto s = std::make_shared<session>(std::move(socket), *this);
      if (connections.load() > cfg.max_connections) s->refuse(503, "too many connections", {{"Retry-After", "1"}});
      else s->read();
    }
    accept();
  });
}

void server::impl::publish_here(const std::string& event) {
  std::erase_if(streams, [](const std::weak_ptr<session>& w) { return w.expired(); });
  for (auto& w : streams)
    if (auto s = w.lock()) s->send_event(event);
}

server::server(server_config cfg, const router& routes) : impl_(std::make_unique<impl>(std::move(cfg), routes)) {
  auto& m = *impl_;
  const auto colon = m.cfg.listen.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("listen address " + m.cfg.listen + " is not HOST:PORT");
  const std::string host = m.cfg.listen.substr(0, colon), port = m.cfg.listen.substr(colon + 1);
  try {
    tcp::resolver resolver(m.io);
    auto endpoint = resolver.resolve(host, port, tcp::resolver::passive | tcp::resolver::numeric_service)->endpoint();
    m.acceptor.open(endpoint.protocol());
    m.acceptor.set_option(asio::socket_base::reuse_address(true));
    m.acceptor.bind(endpoint);
    m.acceptor.listen(asio::socket_base::max_listen_connections);
    m.port = m.acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error("cannot serve HTTP on " + m.cfg.listen + ": " + e.code().message());
  }
  m.accept();
  m.thread = std::thread([&m] {
    try {
      m.io.run();
    } catch (const std::exception& e) {
      troupe::log().error("the HTTP server stopped: {}", e.what());
    }
  });
}

server::~server() {
  impl_->io.stop();
  impl_->thread.join();
}

std::uint16_t server::port() const noexcept { return impl_->port; }

std::size_t server::streams() const noexcept { return impl_->stream_count.load(); }

void server::publish(std::string data) {
  asio::post(impl_->io, [m = impl_.get(), event = format_event(data)] { m->publish_here(event); });
}

}  // namespace troupe::http
