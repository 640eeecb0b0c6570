#include "net/node_protocol.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <stdexcept>
#include <typeinfo>

#include "net/transport.hpp"

namespace troupe::detail {

spawn_opts_tuple pack(const spawn_options& o) {
  return {o.mailbox_capacity, static_cast<std::uint8_t>(o.overflow), o.restart.max_restarts,
          o.restart.backoff.count(), o.restart.backoff_multiplier, o.restart.max_backoff.count(),
          o.reentrant, o.fail_on_ask_exception, o.detached};
}
spawn_options unpack(const spawn_opts_tuple& t) {
  spawn_options o;
  o.mailbox_capacity = std::get<0>(t);
  if (std::get<1>(t) > static_cast<std::uint8_t>(overflow_policy::reject))
    throw error(errc::decode_error, "unknown overflow policy");
  o.overflow = static_cast<overflow_policy>(std::get<1>(t));
  o.restart.max_restarts = std::get<2>(t);
  o.restart.backoff = std::chrono::milliseconds(std::get<3>(t));
  o.restart.backoff_multiplier = std::get<4>(t);
  o.restart.max_backoff = std::chrono::milliseconds(std::get<5>(t));
  o.reentrant = std::get<6>(t);
  o.fail_on_ask_exception = std::get<7>(t);
  o.detached = std::get<8>(t);
  return o;
}

bool made_of(std::string_view text, std::string_view others) {
  return std::all_of(text.begin(), text.end(), [others](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           others.find(ch) != std::string_view::npos;
  });
}

std::string label_problem(const std::vector<std::string>& labels) {
  if (labels.size() > 32) return std::to_string(labels.size()) + " labels, more than 32";
  for (auto& l : labels) {
    if (l.empty() || l.size() > 64) return "a label of " + std::to_string(l.size()) + " characters (1 to 64)";
    if (!made_of(l, "._:=/-")) return "the label '" + l + "' has a character outside [A-Za-z0-9._:=/-]";
  }
  return {};
}

std::pair<std::string, std::uint16_t> split_address(const std::string& a, const char* what) {
  auto colon = a.rfind(':');
  auto bad = [&](const char* why) {
    return std::invalid_argument(std::string(what) + " '" + a + "' is not HOST:PORT (" + why + ")");
  };
  if (colon == std::string::npos || colon == 0) throw bad("no port");
  std::string host = a.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned port = 0;
  auto p = a.data() + colon + 1, end = a.data() + a.size();
  auto [ptr, ec] = std::from_chars(p, end, port);
  if (p == end || ec != std::errc() || ptr != end || port > 65535) throw bad("the port must be 0-65535");
  return {host, static_cast<std::uint16_t>(port)};
}

net::tls_config tls_settings(const std::string& cert, const std::string& key, const std::string& ca) {
  auto pick = [](const std::string& v, const char* env) {
    if (!v.empty()) return v;
    const char* e = std::getenv(env);
    return std::string(e ? e : "");
  };
  net::tls_config tls{pick(cert, "TROUPE_TLS_CERTIFICATE"), pick(key, "TROUPE_TLS_PRIVATE_KEY"), pick(ca, "TROUPE_TLS_CA")};
  // TLS is on when a certificate is named: a key or a CA alone would leave the node in plain
  // text while its operator believes it secured.
  if (!tls.enabled() && (!tls.private_key.empty() || !tls.ca.empty()))
    throw std::invalid_argument(
        "a TLS private key or CA is set but no certificate: name the certificate too (node_config::tls_certificate, "
        "--tls-cert or TROUPE_TLS_CERTIFICATE), or drop the key and CA for plain TCP");
  return tls;
}

std::string too_large(std::size_t bytes, const char* what) {
  return std::string(what) + " of " + std::to_string(bytes) + " bytes is larger than the " +
         std::to_string(max_payload_bytes) + " bytes a frame may carry";
}

std::pair<errc, std::string> describe(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const error& x) {
    // what() ends with the category's text, which the receiver's error adds again.
    std::string what = x.what();
    auto suffix = ": " + x.code().message();
    if (what.size() > suffix.size() && what.ends_with(suffix)) what.resize(what.size() - suffix.size());
    return {x.code_value(), what};
  } catch (const std::exception& x) {
    return {errc::remote_exception, demangle(typeid(x).name()) + ": " + x.what()};
  } catch (...) {
    return {errc::remote_exception, "an exception that is not a std::exception"};
  }
}

std::exception_ptr error_from(const envelope& env) {
  auto code = static_cast<errc>(env.error_code);
  if (env.error_code == 0 || env.error_code > static_cast<std::uint32_t>(errc::message_too_large))
    code = errc::remote_exception;
  return std::make_exception_ptr(error(code, env.error_message));
}

}  // namespace troupe::detail
