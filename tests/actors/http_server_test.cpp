// troupe::http (http_server.hpp): the parsing helpers, the rate limiter, and the server over
// real sockets on loopback (routes, errors, limits, the token, concurrent clients, an event
// stream).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "troupe/actors/http_server.hpp"

namespace http = troupe::http;
using namespace std::chrono_literals;

namespace {

/// A connected loopback socket to `port` (closed by the destructor).
struct client {
  explicit client(std::uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ADD_FAILURE() << "cannot connect to port " << port;
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~client() { ::close(fd); }
  void send(const std::string& s) const {
    std::size_t done = 0;
    while (done < s.size()) {
      auto n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may close early (a refused request); the reply says why
      done += static_cast<std::size_t>(n);
    }
  }
  /// Reads until `until` appears or the connection closes (or 5 s pass).
  std::string read(const std::string& until = "") const {
    std::string out;
    char buf[4096];
    while (until.empty() || out.find(until) == std::string::npos) {
      auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
  }
  int fd;
};

/// One request on its own connection; the whole reply.
std::string roundtrip(std::uint16_t port, const std::string& request) {
  client c(port);
  c.send(request);
  return c.read();
}

std::string get(std::uint16_t port, const std::string& target, const std::string& more_fields = "") {
  return roundtrip(port, "GET " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + more_fields + "\r\n");
}

int status_of(const std::string& reply) {
  if (reply.rfind("HTTP/1.1 ", 0) != 0) return -1;
  return std::stoi(reply.substr(9, 3));
}

std::string body_of(const std::string& reply) {
  auto p = reply.find("\r\n\r\n");
  return p == std::string::npos ? "" : reply.substr(p + 4);
}

void add_routes(http::router& r) {
  r.route("/hello", [](const http::request& q) { return http::response(200, "hi " + q.method); });
  r.route("/echo", [](const http::request& q) { return http::response(200, q.body); }, true);
  r.route("/throws", [](const http::request&) -> http::response { throw std::runtime_error("boom"); });
}

http::request make_request(std::string method, std::string target) {
  http::request q;
  q.method = std::move(method);
  q.target = std::move(target);
  return q;
}

}  // namespace

TEST(HttpParse, PercentDecodingRefusesBadEscapesAndNul) {
  EXPECT_EQ(http::percent_decode("/a%20b%2Fc").value(), "/a b/c");
  EXPECT_EQ(http::percent_decode("a+b").value(), "a+b");
  EXPECT_EQ(http::percent_decode("a+b", true).value(), "a b");
  EXPECT_FALSE(http::percent_decode("%G1"));
  EXPECT_FALSE(http::percent_decode("%4"));
  EXPECT_FALSE(http::percent_decode("abc%"));
  EXPECT_FALSE(http::percent_decode("%00"));
  EXPECT_EQ(http::target_path("/api/nodes?x=1").value(), "/api/nodes");
  EXPECT_FALSE(http::target_path("http://evil/x"));
  EXPECT_FALSE(http::target_path(""));
}

TEST(HttpParse, QueriesCookiesAndBearerFieldsAreSplitAsSent) {
  auto q = http::parse_query("a=1&b=x%20y&&c&d=%zz");
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0], (std::pair<std::string, std::string>{"a", "1"}));
  EXPECT_EQ(q[1], (std::pair<std::string, std::string>{"b", "x y"}));
  EXPECT_EQ(q[2], (std::pair<std::string, std::string>{"c", ""}));
  std::string many;
  for (int i = 0; i < 100; ++i) many += "k=v&";
  EXPECT_EQ(http::parse_query(many).size(), 64u);

  EXPECT_EQ(http::cookie_value("a=1; troupe_session=xyz; b=2", "troupe_session").value(), "xyz");
  EXPECT_EQ(http::cookie_value("troupe_session=\"q\"", "troupe_session").value(), "q");
  EXPECT_FALSE(http::cookie_value("xtroupe_session=1; a", "troupe_session"));

  EXPECT_EQ(http::bearer_token("Bearer abc").value(), "abc");
  EXPECT_EQ(http::bearer_token("bearer   abc ").value(), "abc");
  EXPECT_FALSE(http::bearer_token("Basic abc"));
  EXPECT_FALSE(http::bearer_token("Bearer"));
}

TEST(HttpParse, ConstantTimeEqualComparesWholeStrings) {
  EXPECT_TRUE(http::constant_time_equal("secret", "secret"));
  EXPECT_FALSE(http::constant_time_equal("secret", "secreT"));
  EXPECT_FALSE(http::constant_time_equal("secret", "secret2"));
  EXPECT_FALSE(http::constant_time_equal("", "x"));
  EXPECT_TRUE(http::constant_time_equal("", ""));
  EXPECT_FALSE(http::constant_time_equal(std::string("a\0b", 3), "a"));
}

TEST(HttpParse, JsonStringsEscapeMarkupControlsAndBadUtf8) {
  EXPECT_EQ(http::json_string("<img src=x onerror=alert(1)>"), "\"\\u003cimg src=x onerror=alert(1)\\u003e\"");
  EXPECT_EQ(http::json_string("a\"b\\c\nd\x01&"), "\"a\\\"b\\\\c\\nd\\u0001\\u0026\"");
  EXPECT_EQ(http::json_string("caf\xc3\xa9"), "\"caf\xc3\xa9\"");
  EXPECT_EQ(http::json_string("\xff\xc3"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(http::json_string("\xe2\x80\xa8"), "\"\\u2028\"");
  EXPECT_EQ(http::json_string("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // a UTF-16 surrogate is not UTF-8
  EXPECT_EQ(http::prometheus_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(HttpParse, ListenAddressDefaultsToLoopbackAndRefusesBadPorts) {
  EXPECT_EQ(http::listen_address("8080"), "127.0.0.1:8080");
  EXPECT_EQ(http::listen_address("0.0.0.0:80"), "0.0.0.0:80");
  EXPECT_THROW(http::listen_address("70000"), std::invalid_argument);
  EXPECT_THROW(http::listen_address("host:"), std::invalid_argument);
  EXPECT_THROW(http::listen_address(":80"), std::invalid_argument);
  EXPECT_THROW(http::listen_address("80a"), std::invalid_argument);
}

TEST(RateLimiter, AllowsItsBurstThenRefillsAtItsRate) {
  http::rate_limiter l(10, 3);
  const auto t = http::rate_limiter::clock::now();
  EXPECT_TRUE(l.allow("a", t));
  EXPECT_TRUE(l.allow("a", t));
  EXPECT_TRUE(l.allow("a", t));
  EXPECT_FALSE(l.allow("a", t));
  EXPECT_TRUE(l.allow("b", t));  // another client has its own bucket
  EXPECT_FALSE(l.allow("a", t + 50ms));  // half a token
  EXPECT_TRUE(l.allow("a", t + 100ms));
  EXPECT_FALSE(l.allow("a", t + 100ms));
  EXPECT_TRUE(l.allow("a", t + 10s));  // never more than the burst
  EXPECT_TRUE(l.allow("a", t + 10s));
  EXPECT_TRUE(l.allow("a", t + 10s));
  EXPECT_FALSE(l.allow("a", t + 10s));
}

TEST(Router, RoutesMethodsAndFailuresAnswerWithTheirStatus) {
  http::router r;
  add_routes(r);
  auto q = make_request("GET", "/hello?x=1");
  EXPECT_EQ(r.dispatch(q).body, "hi GET");
  q.target = "/nope";
  EXPECT_EQ(r.dispatch(q).status, 404u);
  q.target = "/%zz";
  EXPECT_EQ(r.dispatch(q).status, 400u);
  q.target = "/throws";
  EXPECT_EQ(r.dispatch(q).status, 500u);
  q = make_request("POST", "/hello");
  EXPECT_EQ(r.dispatch(q).status, 405u);
  q = make_request("DELETE", "/hello");
  EXPECT_EQ(r.dispatch(q).status, 405u);
}

TEST(HttpServer, ServesRoutesOnLoopbackWith404ForUnknownPaths) {
  http::router r;
  add_routes(r);
  http::server s({}, r);
  ASSERT_NE(s.port(), 0);
  auto reply = get(s.port(), "/hello");
  EXPECT_EQ(status_of(reply), 200) << reply;
  EXPECT_EQ(body_of(reply), "hi GET");
  EXPECT_NE(reply.find("X-Content-Type-Options: nosniff"), std::string::npos);
  EXPECT_EQ(status_of(get(s.port(), "/missing")), 404);
  // Keep-alive: two requests on one connection.
  client c(s.port());
  c.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  auto both = c.read();
  int replies = 0;
  for (std::size_t p = 0; (p = both.find("hi GET", p)) != std::string::npos; p += 6) ++replies;
  EXPECT_EQ(replies, 2) << both;
}

TEST(HttpServer, MalformedRequestsGet400AndTheServerGoesOn) {
  http::router r;
  add_routes(r);
  http::server s({}, r);
  EXPECT_EQ(status_of(roundtrip(s.port(), "GARBAGE\r\n\r\n")), 400);
  EXPECT_EQ(status_of(roundtrip(s.port(), "GET /hello HTTP/9.9\r\n\r\n")), 400);
  EXPECT_EQ(status_of(roundtrip(s.port(), "GET /hello HTTP/1.1\r\nBad Field\r\n\r\n")), 400);
  EXPECT_EQ(status_of(roundtrip(s.port(), "GET /hello HTTP/1.1\r\nContent-Length: x\r\n\r\n")), 400);
  EXPECT_EQ(status_of(roundtrip(s.port(), "GET /%zz HTTP/1.1\r\nConnection: close\r\n\r\n")), 400);
  EXPECT_EQ(status_of(get(s.port(), "/hello")), 200);
}

TEST(HttpServer, TooLargeBodiesGet413AndTooLargeHeadsGet431) {
  http::router r;
  add_routes(r);
  http::server_config cfg;
  cfg.max_head_bytes = 1024;
  cfg.max_fields = 8;
  cfg.max_body_bytes = 100;
  http::server s(cfg, r);
  auto small = roundtrip(s.port(), "POST /echo HTTP/1.1\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(body_of(small), "hello");
  const std::string big(5000, 'x');
  auto reply = roundtrip(s.port(), "POST /echo HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + big);
  EXPECT_EQ(status_of(reply), 413) << reply;
  reply = roundtrip(s.port(), "GET /hello HTTP/1.1\r\nX-Long: " + std::string(4000, 'a') + "\r\n\r\n");
  EXPECT_EQ(status_of(reply), 431) << reply;
  std::string fields;
  for (int i = 0; i < 20; ++i) fields += "X-F" + std::to_string(i) + ": 1\r\n";
  reply = roundtrip(s.port(), "GET /hello HTTP/1.1\r\n" + fields + "\r\n");
  EXPECT_EQ(status_of(reply), 431) << reply;
  EXPECT_EQ(status_of(get(s.port(), "/hello")), 200);
}

TEST(HttpServer, WithATokenRequestsNeedItAsBearerOrLoginCookie) {
  http::router r({.token = "s3cret", .title = "test"});
  add_routes(r);
  http::server s({}, r);
  auto reply = get(s.port(), "/hello");
  EXPECT_EQ(status_of(reply), 401);
  EXPECT_NE(reply.find("WWW-Authenticate: Bearer"), std::string::npos);
  EXPECT_EQ(status_of(get(s.port(), "/hello", "Authorization: Bearer wrong\r\n")), 401);
  EXPECT_EQ(status_of(get(s.port(), "/missing", "Authorization: Bearer wrong\r\n")), 401);  // no path probing
  EXPECT_EQ(status_of(get(s.port(), "/hello", "Authorization: Bearer s3cret\r\n")), 200);
  EXPECT_EQ(status_of(get(s.port(), "/hello", "Cookie: troupe_session=guess\r\n")), 401);
  EXPECT_EQ(status_of(get(s.port(), "/login")), 200);

  const std::string form = "token=wrong";
  reply = roundtrip(s.port(), "POST /login HTTP/1.1\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                             "Content-Length: " + std::to_string(form.size()) + "\r\n\r\n" + form);
  EXPECT_EQ(status_of(reply), 401);
  EXPECT_EQ(reply.find("Set-Cookie"), std::string::npos);
  const std::string good = "token=s3cret";
  reply = roundtrip(s.port(), "POST /login HTTP/1.1\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                             "Content-Length: " + std::to_string(good.size()) + "\r\n\r\n" + good);
  EXPECT_EQ(status_of(reply), 303) << reply;
  const auto at = reply.find("Set-Cookie: troupe_session=");
  ASSERT_NE(at, std::string::npos) << reply;
  const auto line = reply.substr(at, reply.find("\r\n", at) - at);
  EXPECT_NE(line.find("HttpOnly"), std::string::npos) << line;
  EXPECT_NE(line.find("SameSite=Strict"), std::string::npos) << line;
  const auto value = line.substr(std::string("Set-Cookie: ").size(), line.find(';') - std::string("Set-Cookie: ").size());
  EXPECT_EQ(status_of(get(s.port(), "/hello", "Cookie: " + value + "\r\n")), 200);
}

TEST(HttpServer, AClientOverItsRateGets429) {
  http::router r;
  add_routes(r);
  http::server_config cfg;
  cfg.requests_per_s = 1;
  cfg.burst = 5;
  http::server s(cfg, r);
  client c(s.port());
  std::string many;
  for (int i = 0; i < 8; ++i) many += "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
  many += "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  c.send(many);
  auto replies = c.read();
  int ok = 0, limited = 0;
  for (std::size_t p = 0; (p = replies.find("HTTP/1.1 ", p)) != std::string::npos; p += 9) {
    const int st = std::stoi(replies.substr(p + 9, 3));
    ok += st == 200;
    limited += st == 429;
  }
  EXPECT_EQ(ok, 5) << replies;
  EXPECT_EQ(limited, 4) << replies;
  EXPECT_NE(replies.find("Retry-After: 1"), std::string::npos);
}

TEST(HttpServer, ServesConcurrentClients) {
  http::router r;
  add_routes(r);
  http::server_config cfg;
  cfg.requests_per_s = cfg.burst = 1e6;
  http::server s(cfg, r);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) ok += status_of(get(s.port(), "/hello")) == 200;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 16 * 20);
}

TEST(HttpServer, ConnectionsPastTheLimitGet503) {
  http::router r;
  add_routes(r);
  http::server_config cfg;
  cfg.max_connections = 2;
  http::server s(cfg, r);
  client a(s.port()), b(s.port());
  a.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");  // both open and served
  b.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(a.read("hi GET").find("hi GET"), std::string::npos);
  EXPECT_NE(b.read("hi GET").find("hi GET"), std::string::npos);
  EXPECT_EQ(status_of(get(s.port(), "/hello")), 503);
}

TEST(HttpServer, AnEventStreamDeliversWhatIsPublished) {
  http::router r;
  r.route("/events", [](const http::request&) {
    http::response res(200, "first");
    res.event_stream = true;
    return res;
  });
  http::server s({}, r);
  client c(s.port());
  c.send("GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n");
  auto head = c.read("data: first\n\n");
  EXPECT_EQ(status_of(head), 200) << head;
  EXPECT_NE(head.find("Content-Type: text/event-stream"), std::string::npos) << head;
  for (int i = 0; i < 100 && s.streams() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(s.streams(), 1u);
  s.publish("{\"round\":1}\nsecond line");
  auto event = c.read("second line\n\n");
  EXPECT_NE(event.find("data: {\"round\":1}\ndata: second line\n\n"), std::string::npos) << event;
}
