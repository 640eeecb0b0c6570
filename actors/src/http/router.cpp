// What troupe does with a request Beast parsed (http_server.hpp): the decoding of targets,
// queries, cookies and bearer fields, the token guard with its login page, the rate limiter and
// the routes. No Asio or Beast here: the fuzzer (tests/fuzz/http_fuzz.cpp) builds this file alone.

#include <algorithm>
#include <array>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "troupe/actors/http_server.hpp"

namespace troupe::http {

namespace {

int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [&](char x, char y) { return lower(x) == lower(y); });
}

/// The length of the valid UTF-8 sequence at the start of `s`, 0 if it is not one.
std::size_t utf8_length(std::string_view s) noexcept {
  auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned lo = 0x80, hi = 0xbf;  // the bounds of the second byte (no overlong form, no surrogate)
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c == 0xe0) n = 3, lo = 0xa0;
  else if (c == 0xed) n = 3, hi = 0x9f;
  else if (c >= 0xe1 && c <= 0xef) n = 3;
  else if (c == 0xf0) n = 4, lo = 0x90;
  else if (c == 0xf4) n = 4, hi = 0x8f;
  else if (c >= 0xf1 && c <= 0xf3) n = 4;
  else return 0;
  if (s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (std::size_t i = 2; i < n; ++i)
    if (b(i) < 0x80 || b(i) > 0xbf) return 0;
  return n;
}

const char* const login_form =
    "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s: sign in</title>"
    "<link rel=\"stylesheet\" href=\"/dashboard.css\"></head><body><main><h1>%s</h1><p>%s</p>"
    "<form method=\"post\" action=\"/login\"><label>Cluster token <input type=\"password\" name=\"token\" "
    "autocomplete=\"current-password\" autofocus></label> <button>Sign in</button></form></main></body></html>";

std::string escape_html(std::string_view s) {
  std::string out;
  for (char c : s) switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  return out;
}

std::string login_page(const std::string& title, const char* message) {
  const std::string t = escape_html(title);
  std::string out(std::size_t(1024) + 2 * t.size(), '\0');
  int n = std::snprintf(out.data(), out.size(), login_form, t.c_str(), t.c_str(), message);
  out.resize(static_cast<std::size_t>(std::max(n, 0)));
  return out;
}

response error_response(unsigned status, std::string body) {
  return response(status, std::move(body) + "\n");
}

}  // namespace

std::optional<std::string> percent_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size()) return std::nullopt;
      const int h = hex_digit(s[i + 1]), l = hex_digit(s[i + 2]);
      if (h < 0 || l < 0 || (h == 0 && l == 0)) return std::nullopt;
      out += static_cast<char>(h * 16 + l);
      i += 2;
    } else if (s[i] == '\0') {
      return std::nullopt;
    } else if (plus_is_space && s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

std::optional<std::string> target_path(std::string_view target) {
  if (target.empty() || target.front() != '/') return std::nullopt;
  return percent_decode(target.substr(0, target.find('?')));
}

std::vector<std::pair<std::string, std::string>> parse_query(std::string_view query) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!query.empty() && out.size() < 64) {
    const auto amp = query.find('&');
    const auto pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    auto key = percent_decode(pair.substr(0, eq), true);
    auto value = percent_decode(eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1), true);
    if (key && value) out.emplace_back(std::move(*key), std::move(*value));
  }
  return out;
}

std::optional<std::string> cookie_value(std::string_view field, std::string_view name) {
  while (!field.empty()) {
    const auto semi = field.find(';');
    const auto item = trim(field.substr(0, semi));
    field = semi == std::string_view::npos ? std::string_view{} : field.substr(semi + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) continue;
    if (trim(item.substr(0, eq)) != name) continue;
    auto value = trim(item.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    return std::string(value);
  }
  return std::nullopt;
}

std::optional<std::string> bearer_token(std::string_view authorization) {
  authorization = trim(authorization);
  const auto space = authorization.find(' ');
  if (space == std::string_view::npos || !iequals(authorization.substr(0, space), "bearer")) return std::nullopt;
  return std::string(trim(authorization.substr(space + 1)));
}

bool constant_time_equal(std::string_view a, std::string_view b) noexcept {
  // Every byte of the longer is looked at whatever the lengths; the lengths are compared too.
  const std::size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  out.reserve(s.size() + 2);
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = utf8_length(s.substr(i));
    char buf[8];
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (n == 3 && c == 0xe2 && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
        (static_cast<unsigned char>(s[i + 2]) == 0xa8 || static_cast<unsigned char>(s[i + 2]) == 0xa9)) {
      out += static_cast<unsigned char>(s[i + 2]) == 0xa8 ? "\\u2028" : "\\u2029";
    } else if (n > 1) {
      out.append(s.substr(i, n));
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == '<' || c == '>' || c == '&' || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
    i += n;
  }
  return out + "\"";
}

std::string prometheus_label(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

bool rate_limiter::allow(const std::string& client, clock::time_point now) {
  std::lock_guard lock(mu_);
  if (buckets_.size() > 4096) {  // forget the full ones rather than grow without bound
    std::erase_if(buckets_, [&](const auto& b) {
      return b.second.tokens + std::chrono::duration<double>(now - b.second.at).count() * rate_ >= burst_;
    });
  }
  auto [it, fresh] = buckets_.try_emplace(client, bucket{burst_, now});
  auto& b = it->second;
  if (!fresh && now > b.at) {
    b.tokens = std::min(burst_, b.tokens + std::chrono::duration<double>(now - b.at).count() * rate_);
    b.at = now;
  }
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

router::router(router_config cfg) : cfg_(std::move(cfg)) {}

void router::route(std::string path, handler h, bool post) {
  if (path.empty() || path.front() != '/') throw std::invalid_argument("a route's path starts with '/': " + path);
  if (path == "/login") throw std::invalid_argument("/login is the router's own route");
  routes_[std::move(path)] = entry{std::move(h), post};
}

bool router::authorized(const request& r) const {
  if (cfg_.token.empty()) return true;
  if (auto t = bearer_token(r.authorization)) return constant_time_equal(*t, cfg_.token);
  if (auto c = cookie_value(r.cookie, "troupe_session")) {
    std::lock_guard lock(mu_);
    // A set lookup compares bytes early-out; the session values are random and long, and a
    // guess learns nothing from the time a miss takes that would shorten the search.
    return sessions_.count(*c) > 0;
  }
  return false;
}

response router::login(const request& r) const {
  if (r.method != "POST") {
    return response(200, login_page(cfg_.title, cfg_.token.empty() ? "This server needs no token." : "This dashboard needs the cluster's token."),
                    "text/html; charset=utf-8");
  }
  std::string given;
  for (auto& [k, v] : parse_query(r.body))
    if (k == "token") given = v;
  if (cfg_.token.empty() || !constant_time_equal(given, cfg_.token)) {
    return response(401, login_page(cfg_.title, "That is not the token."), "text/html; charset=utf-8");
  }
  static thread_local std::random_device rd;
  std::string session;
  for (int i = 0; i < 4; ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    session += buf;
  }
  {
    std::lock_guard lock(mu_);
    if (sessions_.size() >= 1024) sessions_.clear();  // everyone signs in again: bounded memory
    sessions_.insert(session);
  }
  response res(303, "signed in\n");
  res.headers = {{"Location", "/"}, {"Set-Cookie", "troupe_session=" + session + "; Path=/; HttpOnly; SameSite=Strict"}};
  return res;
}

response router::dispatch(const request& r) const {
  try {
    const auto path = target_path(r.target);
    if (!path) return error_response(400, "bad request target");
    const bool head = r.method == "HEAD";
    if (r.method != "GET" && r.method != "POST" && !head) return error_response(405, "method not allowed");
    if (*path == "/login" && !head) return login(r);
    if (*path == "/dashboard.css") {  // the login page's style needs no token: it holds nothing
      if (auto it = routes_.find(*path); it != routes_.end()) return it->second.h(r);
    }
    if (!authorized(r)) {
      response res(401,
                   login_page(cfg_.title, "This dashboard needs the cluster's token: <a href=\"/login\">sign in</a>, "
                                          "or send it as Authorization: Bearer."),
                   "text/html; charset=utf-8");
      res.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"troupe\"");
      return res;
    }
    auto it = routes_.find(*path);
    if (it == routes_.end()) return error_response(404, "not found");
    if (r.method == "POST" && !it->second.post) return error_response(405, "method not allowed");
    auto res = it->second.h(r);
    if (head) res.body.clear();
    return res;
  } catch (const std::exception& e) {
    return error_response(500, std::string("internal error: ") + e.what());
  } catch (...) {
    return error_response(500, "internal error");
  }
}

std::string listen_address(std::string_view host_port) {
  const auto colon = host_port.rfind(':');
  const std::string host = colon == std::string_view::npos ? "127.0.0.1" : std::string(host_port.substr(0, colon));
  const auto port = colon == std::string_view::npos ? host_port : host_port.substr(colon + 1);
  if (host.empty()) throw std::invalid_argument("no host before ':' in " + std::string(host_port) + " (give [HOST:]PORT)");
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoul(std::string(port)) > 65535)
    throw std::invalid_argument("the port of " + std::string(host_port) + " is not a number from 0 to 65535 (give [HOST:]PORT)");
  return host + ":" + std::string(port);
}

}  // namespace troupe::http
