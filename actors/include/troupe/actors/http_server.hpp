#pragma once
/// @file
/// One small HTTP/1.1 server for what a node serves people and scripts (the dashboard, /metrics,
/// /api/...): routes are callbacks; the parsing of a request is Boost.Beast's, kept in
/// src/http/ with Asio, so that nothing here needs Boost.
///
///   troupe::http::router r({.token = "s3cret"});
///   r.route("/hello", [](const troupe::http::request&) { return troupe::http::response(200, "hi"); });
///   troupe::http::server s({.listen = "127.0.0.1:0"}, r);   // serving from here on
///   std::uint16_t port = s.port();
///   s.publish("{\"x\":1}");                                  // to every open /events stream
///
/// Limits: a request's head (request line and fields) and its number of fields, its body, the
/// open connections and the requests per second of one client address are bounded; a request
/// past one gets an HTTP error (431, 413, 503, 429), a malformed one 400, and the server goes on.
/// With a token, every route but /login needs it: as `Authorization: Bearer TOKEN`, or the cookie
/// that a POST of the token to /login sets (HttpOnly, SameSite=Strict); tokens are compared in
/// constant time.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::http {

/// A request as the routes see it (after Beast parsed it).
struct request {
  std::string method;  ///< "GET", "POST", ...
  std::string target;  ///< as sent: "/api/nodes?x=1"
  std::string authorization;  ///< the Authorization field ("" if none)
  std::string cookie;         ///< the Cookie field ("" if none)
  std::string content_type;
  std::string body;
  std::string client;  ///< the peer's address (the rate limit's key)
};

struct response {
  response() = default;
  response(unsigned status, std::string body, std::string content_type = "text/plain; charset=utf-8")
      : status(status), content_type(std::move(content_type)), body(std::move(body)) {}
  unsigned status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  ///< more fields
  /// The request opens a server-sent event stream: the server answers with
  /// text/event-stream, sends `body` (if any) as its first event and then what publish() sends.
  bool event_stream = false;
};

using handler = std::function<response(const request&)>;

// ---- parsing what Beast leaves to us (pure; fuzzed by tests/fuzz/http_fuzz.cpp) -------------

/// "/a%20b" -> "/a b"; '+' stays '+' (paths) unless `plus_is_space` (forms, queries). nullopt
/// for a bad escape ("%G1", "%4") or a NUL, escaped or not.
std::optional<std::string> percent_decode(std::string_view s, bool plus_is_space = false);

/// The path of a request target ("/api/nodes?x=1" -> "/api/nodes"), decoded; nullopt when the
/// target is not an absolute path or does not decode.
std::optional<std::string> target_path(std::string_view target);

/// "a=1&b=x%20y&c" -> {{"a","1"},{"b","x y"},{"c",""}} (from a target's query or a form body);
/// pairs that do not decode are left out. At most 64 pairs.
std::vector<std::pair<std::string, std::string>> parse_query(std::string_view query);

/// The value of cookie `name` in a Cookie field ("a=1; troupe_session=xyz"), nullopt if absent.
std::optional<std::string> cookie_value(std::string_view cookie_field, std::string_view name);

/// The token of "Bearer TOKEN" (scheme case-insensitive), nullopt for another scheme.
std::optional<std::string> bearer_token(std::string_view authorization);

/// Equality that takes the same time wherever the first difference is (for secrets).
bool constant_time_equal(std::string_view a, std::string_view b) noexcept;

/// `s` as a JSON string literal with its quotes; <, >, & and the line separators escaped too, so
/// that the text is safe inside HTML as well. Bytes that are not UTF-8 become U+FFFD.
std::string json_string(std::string_view s);

/// A Prometheus label value escaped: \ -> \\, " -> \", newline -> \n.
std::string prometheus_label(std::string_view s);

/// Per-client token buckets: `rate` requests per second, `burst` at once. @threadsafe
class rate_limiter {
public:
  using clock = std::chrono::steady_clock;
  rate_limiter(double rate, double burst) : rate_(rate), burst_(burst) {}
  /// Takes one token of `client`'s bucket at `now`; false when it is empty.
  bool allow(const std::string& client, clock::time_point now);

private:
  struct bucket {
    double tokens;
    clock::time_point at;
  };
  double rate_, burst_;
  std::mutex mu_;
  std::map<std::string, bucket> buckets_;
};

struct router_config {
  /// Empty: no authentication. Otherwise every route but /login needs it.
  std::string token;
  /// The page's title (the login page says it).
  std::string title = "troupe";
};

/// The routes and their guard: what troupe does with a parsed request. @threadsafe once routes
/// are registered (route() before the server starts).
class router {
public:
  explicit router(router_config cfg = {});
  /// `h` answers GET (and HEAD) of exactly `path`; with `post`, POST too.
  void route(std::string path, handler h, bool post = false);
  /// The answer to `r`: 400 for a target that does not decode, 401 without the token, 404 for
  /// an unknown path, 405 for a method the route does not take, 500 when the handler throws;
  /// GET/POST /login: the login form / the cookie. Never throws.
  response dispatch(const request& r) const;
  bool needs_token() const noexcept { return !cfg_.token.empty(); }
  /// Whether `r` carries the token (as a bearer field or a session cookie from /login).
  bool authorized(const request& r) const;

private:
  response login(const request& r) const;
  struct entry {
    handler h;
    bool post;
  };
  router_config cfg_;
  std::map<std::string, entry, std::less<>> routes_;
  mutable std::mutex mu_;
  mutable std::set<std::string, std::less<>> sessions_;  // cookie values /login gave out
};

struct server_config {
  /// HOST:PORT to listen on; port 0: any free one (port() says which).
  std::string listen = "127.0.0.1:0";
  std::size_t max_head_bytes = 8 * 1024;  ///< request line and fields (431 past it)
  std::size_t max_fields = 64;            ///< fields per request (431 past it)
  std::size_t max_body_bytes = 16 * 1024; ///< 413 past it
  std::size_t max_connections = 64;       ///< open at once, event streams included (503 past it)
  double requests_per_s = 50;             ///< per client address (429 past it)
  double burst = 100;
  std::chrono::milliseconds idle_timeout{15'000};  ///< a connection that sends nothing is closed
};

/// Serves `routes` on one thread of its own from construction to destruction.
class server {
public:
  /// Listens (throws std::invalid_argument for a malformed address, std::runtime_error when it
  /// cannot listen there) and starts serving. `routes` must outlive the server.
  server(server_config cfg, const router& routes);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;
  std::uint16_t port() const noexcept;
  /// Sends `data` as one event (`data: ...` lines) to every open event stream. @threadsafe
  void publish(std::string data);
  /// Event streams open now. @threadsafe
  std::size_t streams() const noexcept;

  struct impl;  ///< its state and sessions (src/http/server.cpp)

private:
  std::unique_ptr<impl> impl_;
};

/// "8080" -> "127.0.0.1:8080", "0.0.0.0:8080" as given: the `--dashboard [HOST:]PORT` of the
/// commands. Throws std::invalid_argument saying what is wrong.
std::string listen_address(std::string_view host_port);

}  // namespace troupe::http
