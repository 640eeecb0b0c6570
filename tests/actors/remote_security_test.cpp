// Who may talk to a cluster: a wrong token and untrusted TLS certificates are refused, hostile
// bytes close only their own connection, and TLS settings are checked.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <gtest/gtest.h>

#include "remote/remote_types.hpp"
#include "remote_support.hpp"

namespace {

using namespace std::chrono_literals;
using namespace remote_support;
using remote_test::kv;
using remote_test::worker;

TEST(Remote, WrongTokenIsRefused) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", "not-the-token"});
  EXPECT_EQ(w.joined(), 0u);
  EXPECT_EQ(w.wait_exit(), 1);
}

TEST(Remote, HostileBytesCloseOnlyTheirConnection) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token});
  auto id = w.joined();
  ASSERT_NE(id, 0u);
  auto a = head.spawn_on<worker>(id, std::int64_t{1});
  ASSERT_EQ(a.ask(&worker::add, 1).get(), 2);
  // Garbage, a huge announced frame and a truncated one, each on its own connection.
  boost::asio::io_context io;
  for (int kind = 0; kind < 3; ++kind) {
    boost::asio::ip::tcp::socket s(io);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), head.node_port()});
    std::vector<unsigned char> bytes;
    if (kind == 0) bytes.assign(4096, 0xAB);
    if (kind == 1) bytes = {0x54, 0x52, 0x50, 0x31, 1, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    if (kind == 2) bytes = {0x54, 0x52, 0x50};
    boost::system::error_code ec;
    boost::asio::write(s, boost::asio::buffer(bytes), ec);
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(a.ask(&worker::add, 2).get(), 3);
}

TEST(Remote, TlsEncryptsTheClusterAndRefusesUntrustedPeers) {
  auto dir = std::filesystem::temp_directory_path() / ("troupe-tls-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto make_cert = [&](const std::string& name) {
    auto d = dir.string();
    return sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + d + "/" +
              name + ".key -out " + d + "/" + name + ".pem -days 2 -subj /CN=troupe-" + name);
  };
  if (!make_cert("cluster") || !make_cert("rogue")) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "the openssl command is missing: cannot make test certificates";
  }
  auto file = [&](const std::string& f) { return (dir / f).string(); };
  auto cfg = head_config();
  cfg.node.tls_certificate = file("cluster.pem");
  cfg.node.tls_private_key = file("cluster.key");
  cfg.node.tls_ca = file("cluster.pem");  // self-signed: it is its own CA
  {
    troupe::actor_system head(cfg);
    child_node w({"--head", head_of(head), "--token", token, "--tls-cert", file("cluster.pem"), "--tls-key",
                  file("cluster.key"), "--tls-ca", file("cluster.pem")});
    auto id = w.joined();
    ASSERT_NE(id, 0u);
    auto a = head.spawn_on<worker>(id, std::int64_t{1});
    EXPECT_EQ(a.ask(&worker::add, 1).get(), 2);
    std::vector<std::byte> big(2 << 20, std::byte{3});
    EXPECT_EQ(a.ask(&worker::echo, big).get(), big);

    // The right token but a certificate the cluster does not trust: refused.
    child_node rogue({"--head", head_of(head), "--token", token, "--tls-cert", file("rogue.pem"), "--tls-key",
                      file("rogue.key"), "--tls-ca", file("cluster.pem")});
    EXPECT_EQ(rogue.joined(), 0u);
    EXPECT_EQ(rogue.wait_exit(), 1);
    // A peer without TLS: refused, and told why.
    try {
      troupe::cluster_status(head_of(head), token, 2s);
      ADD_FAILURE() << "a peer without TLS got the status";
    } catch (const troupe::error& e) {
      EXPECT_NE(std::string(e.what()).find("TLS"), std::string::npos) << e.what();
    }
    EXPECT_EQ(a.ask(&worker::add, 2).get(), 3);
  }
  {
    // The other way round: a plain head, a peer with TLS. Refused at once, and told why.
    troupe::actor_system head(head_config());
    ::setenv("TROUPE_TLS_CERTIFICATE", file("cluster.pem").c_str(), 1);
    ::setenv("TROUPE_TLS_PRIVATE_KEY", file("cluster.key").c_str(), 1);
    auto t0 = clock_type::now();
    try {
      troupe::cluster_status(head_of(head), token, 5s);
      ADD_FAILURE() << "a peer with TLS got the status of a plain head";
    } catch (const troupe::error& e) {
      EXPECT_NE(std::string(e.what()).find("does not speak TLS"), std::string::npos) << e.what();
    }
    EXPECT_LT(clock_type::now() - t0, 2s);
    ::unsetenv("TROUPE_TLS_CERTIFICATE");
    ::unsetenv("TROUPE_TLS_PRIVATE_KEY");
  }
  // Bad TLS settings are a clear error.
  cfg.node.tls_private_key = file("missing.key");
  EXPECT_THROW(troupe::actor_system{cfg}, std::invalid_argument);
  // A key or a CA without a certificate would mean plain TCP: refused, not ignored.
  cfg.node.tls_certificate.clear();
  cfg.node.tls_private_key = file("cluster.key");
  EXPECT_THROW(troupe::actor_system{cfg}, std::invalid_argument);
  cfg.node.tls_private_key.clear();
  EXPECT_THROW(troupe::actor_system{cfg}, std::invalid_argument);  // the CA alone
  std::filesystem::remove_all(dir);
}

}  // namespace
