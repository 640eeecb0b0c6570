// libFuzzer target for what troupe does with an HTTP request once Beast has parsed it (`make
// fuzz`): the router's decoding of the target, the query, the Cookie and Authorization fields
// and a login form, and its routing and token guard. Hostile bytes must never crash, hang or
// throw out of dispatch; whatever comes back must keep the router's promises (the oracle below).
//
// The input is split at the first four '\n' into method, target, Authorization, Cookie and body.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "troupe/actors/http_server.hpp"

namespace http = troupe::http;

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "http_fuzz: %s\n", what.c_str());
  std::abort();
}

const std::string token = "fuzz-token-0123456789";

const http::router& routes() {
  static http::router r({.token = token, .title = "fuzz <title>"});
  static const bool added = [] {
    r.route("/api/state", [](const http::request& q) { return http::response(200, http::json_string(q.target)); });
    r.route("/echo", [](const http::request& q) { return http::response(200, q.body); }, true);
    return true;
  }();
  (void)added;
  return r;
}

std::string_view next(std::string_view& rest) {
  const auto nl = rest.find('\n');
  auto field = rest.substr(0, nl);
  rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
  return field;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  http::request q;
  q.method = next(rest);
  q.target = next(rest);
  q.authorization = next(rest);
  q.cookie = next(rest);
  q.body = rest;
  q.client = "fuzz";

  const auto res = routes().dispatch(q);
  switch (res.status) {
    case 200: case 303: case 400: case 401: case 404: case 405: break;
    default: broken("unexpected status " + std::to_string(res.status));
  }
  const bool bearer_ok = http::bearer_token(q.authorization).value_or("") == token;
  if (res.status == 200 && http::target_path(q.target).value_or("") != "/login" && !bearer_ok) {
    // Without the bearer token only a session cookie from /login opens a route, and this router
    // has given none out unless the body carried the token.
    if (q.body.find(token) == std::string::npos) broken("a route answered without the token");
  }
  if (res.status == 303 && res.headers.empty()) broken("a sign-in without its cookie");

  // The pure helpers on the same bytes: what they promise.
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const auto json = http::json_string(all);
  if (json.size() < 2 || json.front() != '"' || json.back() != '"') broken("json_string is not a string literal");
  for (std::size_t i = 1; i + 1 < json.size(); ++i) {
    const auto c = static_cast<unsigned char>(json[i]);
    if (c < 0x20 || c == '<' || c == '>' || c == '&') broken("json_string left a control or markup character");
    if (c == '"' && json[i - 1] != '\\') broken("json_string left a quote unescaped");
  }
  const auto label = http::prometheus_label(all);
  if (label.find('\n') != std::string::npos) broken("prometheus_label left a newline");
  if (auto d = http::percent_decode(all, true); d && d->find('\0') != std::string::npos) broken("percent_decode made a NUL");
  if (http::parse_query(all).size() > 64) broken("parse_query kept more than 64 pairs");
  (void)http::cookie_value(all, "troupe_session");
  if (http::constant_time_equal(all, all) != true) broken("constant_time_equal(x, x) is false");
  try {
    (void)http::listen_address(all);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
