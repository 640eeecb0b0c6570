#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <troupe/core/error.hpp>

#include "net/transport.hpp"

namespace {

using namespace troupe::net;
using namespace std::chrono_literals;
namespace asio = boost::asio;

// One node's transport on its own io_context thread, recording what it sees.
struct node {
  explicit node(std::string token, std::chrono::milliseconds handshake_timeout = 3s, tls_config tls = {}) {
    transport_config cfg;
    cfg.token = std::move(token);
    cfg.handshake_timeout = handshake_timeout;
    cfg.tls = std::move(tls);
    transport_handlers h;
    h.on_open = [this](const std::shared_ptr<connection>& c) {
      std::lock_guard lock(mutex);
      opened.push_back(c);
      changed.notify_all();
    };
    h.on_envelope = [this](const std::shared_ptr<connection>& c, envelope e) {
      {
        std::lock_guard lock(mutex);
        received.push_back(e);
        changed.notify_all();
      }
      if (echo) c->send(std::move(e));
    };
    h.on_close = [this](const std::shared_ptr<connection>&, const std::string& reason) {
      std::lock_guard lock(mutex);
      closed.push_back(reason);
      changed.notify_all();
    };
    net = std::make_unique<transport>(io, cfg, std::move(h));
    thread = std::thread([this] { io.run(); });
  }
  ~node() {
    work.reset();
    net->close_all("test over");
    io.stop();
    thread.join();
    net.reset();
  }

  // Waits (bounded) until `done` holds under the lock.
  bool wait(const std::function<bool()>& done, std::chrono::seconds limit = 10s) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, limit, done);
  }

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::unique_ptr<transport> net;
  std::thread thread;
  bool echo = false;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::shared_ptr<connection>> opened;
  std::vector<envelope> received;
  std::vector<std::string> closed;
};

envelope a_tell(std::uint64_t n, std::size_t payload_bytes = 8) {
  envelope e;
  e.kind = envelope_kind::tell;
  e.target = 1;
  e.method = n;
  e.payload.resize(payload_bytes);
  std::mt19937_64 rng(n);
  for (std::size_t i = 0; i < payload_bytes; i += 8) {
    auto r = rng();
    std::memcpy(e.payload.data() + i, &r, std::min<std::size_t>(8, payload_bytes - i));
  }
  return e;
}

// A raw client socket that does the handshake by hand, to send what a transport never would.
struct raw_client {
  raw_client(std::uint16_t port, const std::string& token) : socket(io) {
    socket.connect({asio::ip::make_address("127.0.0.1"), port});
    auto challenge = read_envelope();
    EXPECT_EQ(challenge.method, static_cast<std::uint64_t>(control_code::challenge));
    auto proof = handshake_proof(token, "troupe client", challenge.payload);
    std::vector<std::byte> nonce(nonce_bytes, std::byte{7});
    proof.insert(proof.end(), nonce.begin(), nonce.end());
    envelope response;
    response.kind = envelope_kind::control;
    response.method = static_cast<std::uint64_t>(control_code::response);
    response.payload = proof;
    write(encode_frame_bytes(response));
    answer = read_envelope();
  }
  envelope read_envelope() {
    std::byte buf[256];
    while (!decoder.ready()) {
      auto n = socket.read_some(asio::buffer(buf));
      EXPECT_TRUE(decoder.feed(std::span<const std::byte>(buf, n)));
    }
    return *decoder.pop();
  }
  void write(const std::vector<std::byte>& bytes) { asio::write(socket, asio::buffer(bytes)); }
  // True when the server closed the connection (read returns end of file or reset).
  bool closed_by_peer() {
    std::byte buf[256];
    boost::system::error_code ec;
    while (!ec) socket.read_some(asio::buffer(buf), ec);
    return ec == asio::error::eof || ec == asio::error::connection_reset;
  }
  asio::io_context io;
  asio::ip::tcp::socket socket;
  frame_decoder decoder;
  envelope answer;
};

TEST(Transport, FramesFlowBothWaysInSendOrder) {
  node server("cluster-secret"), client("cluster-secret");
  server.echo = true;
  auto port = server.net->listen("127.0.0.1", 0);
  client.net->connect("127.0.0.1", port);
  ASSERT_TRUE(client.wait([&] { return client.opened.size() == 1; }));
  ASSERT_TRUE(server.wait([&] { return server.opened.size() == 1; }));
  EXPECT_TRUE(client.opened[0]->authenticated());
  EXPECT_TRUE(client.opened[0]->outbound());
  EXPECT_FALSE(server.opened[0]->outbound());

  std::vector<envelope> sent;
  for (std::uint64_t i = 1; i <= 500; ++i) sent.push_back(a_tell(i, i % 50 == 0 ? 100'000 : i));
  for (const auto& e : sent) client.opened[0]->send(e);
  ASSERT_TRUE(client.wait([&] { return client.received.size() == sent.size(); }));
  EXPECT_EQ(client.received, sent);  // echoed back by the server, in order
  std::lock_guard lock(server.mutex);
  EXPECT_EQ(server.received, sent);
  EXPECT_TRUE(server.closed.empty());
}

// Payloads with runs of other memory spliced in, some large enough that the kernel takes them
// in several writes (direct, then queued and gathered): every byte arrives, in order.
void spliced_runs_arrive_in_send_order(node& server, node& client) {
  auto port = server.net->listen("127.0.0.1", 0);
  client.net->connect("127.0.0.1", port);
  ASSERT_TRUE(client.wait([&] { return client.opened.size() == 1; }));
  ASSERT_TRUE(server.wait([&] { return server.opened.size() == 1; }));
  std::mt19937 rng(5);
  auto memory = std::make_shared<std::vector<std::byte>>(4u << 20);
  for (auto& b : *memory) b = static_cast<std::byte>(rng());
  std::vector<envelope> sent;
  for (std::uint64_t i = 1; i <= 60; ++i) {
    auto e = a_tell(i, i % 7);
    const std::size_t len = i % 10 == 0 ? (3u << 20) : 1000 + rng() % 300'000;
    const std::size_t from = rng() % (memory->size() - len);
    e.splices.push_back({e.payload.size() / 2, memory, std::span<const std::byte>(*memory).subspan(from, len)});
    sent.push_back(std::move(e));
  }
  for (const auto& e : sent) client.opened[0]->send(e);
  ASSERT_TRUE(server.wait([&] { return server.received.size() == sent.size(); }));
  std::lock_guard lock(server.mutex);
  EXPECT_EQ(server.received, sent);  // payloads compared by their bytes, runs included
  EXPECT_TRUE(server.closed.empty());
}

TEST(Transport, SplicedRunsGoOutFromTheirOwnMemoryInSendOrder) {
  node server("cluster-secret"), client("cluster-secret");
  spliced_runs_arrive_in_send_order(server, client);
}

TEST(Transport, SplicedRunsGoOutInSendOrderUnderTls) {
  // Under TLS the gathered buffers (header, envelope, runs) are encrypted into records, and a
  // large write goes out in several: the same bytes must arrive, in order.
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-transport-tls-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto key = (dir / "node.key").string(), pem = (dir / "node.pem").string();
  const auto cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + key +
                   " -out " + pem + " -days 2 -subj /CN=troupe-transport-test >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "the openssl command is missing: cannot make a test certificate";
  }
  const tls_config tls{.certificate = pem, .private_key = key, .ca = pem};
  {
    node server("cluster-secret", 3s, tls), client("cluster-secret", 3s, tls);
    spliced_runs_arrive_in_send_order(server, client);
  }
  std::filesystem::remove_all(dir);
}

TEST(Transport, SendsQueuedBeforeTheHandshakeLeaveAfterIt) {
  node server("s"), client("s");
  auto port = server.net->listen("127.0.0.1", 0);
  client.net->connect("127.0.0.1", port);
  ASSERT_TRUE(server.wait([&] { return server.opened.size() == 1; }));
  server.opened[0]->send(a_tell(5));
  ASSERT_TRUE(client.wait([&] { return client.received.size() == 1; }));
  EXPECT_EQ(client.received[0], a_tell(5));
}

TEST(Transport, AWrongTokenIsRefusedBeforeAnyEnvelope) {
  node server("right-token"), intruder("wrong-token");
  auto port = server.net->listen("127.0.0.1", 0);
  intruder.net->connect("127.0.0.1", port);
  ASSERT_TRUE(intruder.wait([&] { return intruder.closed.size() == 1; }));
  ASSERT_TRUE(server.wait([&] { return server.closed.size() == 1; }));
  EXPECT_NE(intruder.closed[0].find("wrong cluster token"), std::string::npos) << intruder.closed[0];
  EXPECT_NE(server.closed[0].find("wrong cluster token"), std::string::npos) << server.closed[0];
  EXPECT_TRUE(intruder.opened.empty());
  EXPECT_TRUE(server.opened.empty());
  EXPECT_EQ(server.net->connections(), 0u);
}

TEST(Transport, AnEnvelopeWithoutTheHandshakeIsRefused) {
  node server("token");
  auto port = server.net->listen("127.0.0.1", 0);
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(s, asio::buffer(encode_frame_bytes(a_tell(1))));
  ASSERT_TRUE(server.wait([&] { return server.closed.size() == 1; }));
  EXPECT_NE(server.closed[0].find("expected the handshake response"), std::string::npos) << server.closed[0];
  EXPECT_TRUE(server.received.empty());
}

TEST(Transport, AGarbageFrameClosesOnlyItsConnection) {
  node server("token"), good("token");
  server.echo = true;
  auto port = server.net->listen("127.0.0.1", 0);
  good.net->connect("127.0.0.1", port);
  ASSERT_TRUE(good.wait([&] { return good.opened.size() == 1; }));

  raw_client hostile(port, "token");
  EXPECT_EQ(hostile.answer.method, static_cast<std::uint64_t>(control_code::accept));
  ASSERT_TRUE(server.wait([&] { return server.opened.size() == 2; }));
  // A valid frame first, then a header announcing an envelope of 2^32-8 bytes.
  hostile.write(encode_frame_bytes(a_tell(9)));
  auto bad = encode_frame_bytes(a_tell(10));
  std::uint32_t huge = 0xfffffff8u;
  std::memcpy(bad.data() + 8, &huge, 4);
  hostile.write(bad);
  EXPECT_TRUE(hostile.closed_by_peer());
  ASSERT_TRUE(server.wait([&] { return server.closed.size() == 1; }));
  EXPECT_NE(server.closed[0].find("frame too large"), std::string::npos) << server.closed[0];

  // The other connection is untouched.
  good.opened[0]->send(a_tell(11));
  ASSERT_TRUE(good.wait([&] { return good.received.size() == 1; }));
  EXPECT_EQ(good.received[0], a_tell(11));
  EXPECT_EQ(server.net->connections(), 1u);
  std::lock_guard lock(server.mutex);
  ASSERT_EQ(server.received.size(), 2u);  // the hostile peer's valid frame, then the good one's
}

TEST(Transport, MalformedCapnProtoClosesTheConnectionWithItsReason) {
  node server("token");
  auto port = server.net->listen("127.0.0.1", 0);
  raw_client hostile(port, "token");
  auto bad = encode_frame_bytes(a_tell(3));
  std::uint32_t far = 1000u << 2;  // the root pointer points past the segment
  std::memcpy(bad.data() + frame_header::size + 8, &far, 4);
  hostile.write(bad);
  EXPECT_TRUE(hostile.closed_by_peer());
  ASSERT_TRUE(server.wait([&] { return server.closed.size() == 1; }));
  EXPECT_NE(server.closed[0].find("malformed segments"), std::string::npos) << server.closed[0];
}

TEST(Transport, AHandshakeThatNeverFinishesTimesOut) {
  node server("token", 300ms);
  auto port = server.net->listen("127.0.0.1", 0);
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  ASSERT_TRUE(server.wait([&] { return server.closed.size() == 1; }, 10s));
  EXPECT_NE(server.closed[0].find("handshake timed out"), std::string::npos) << server.closed[0];
}

TEST(Transport, A64MiBPayloadArrivesIntact) {
  node server("token"), client("token");
  auto port = server.net->listen("127.0.0.1", 0);
  client.net->connect("127.0.0.1", port);
  ASSERT_TRUE(client.wait([&] { return client.opened.size() == 1; }));
  auto big = a_tell(77, 64u << 20);
  client.opened[0]->send(big);  // a copy: `big` stays to compare with
  ASSERT_TRUE(server.wait([&] { return server.received.size() == 1; }, 30s));
  EXPECT_EQ(server.received[0].payload.size(), big.payload.size());
  EXPECT_TRUE(server.received[0] == big);
}

TEST(Transport, AConnectionToANodeThatIsNotThereReportsWhy) {
  node client("token");
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
  auto port = a.local_endpoint().port();
  a.close();
  client.net->connect("127.0.0.1", port);
  ASSERT_TRUE(client.wait([&] { return client.closed.size() == 1; }));
  EXPECT_NE(client.closed[0].find("cannot connect"), std::string::npos) << client.closed[0];
}

TEST(Transport, RefusesAnEmptyTokenAndABadAddress) {
  asio::io_context io;
  EXPECT_THROW({ transport t0(io, transport_config{}, {}); }, troupe::error);
  transport_config cfg;
  cfg.token = "t";
  transport t(io, cfg, {});
  try {
    t.listen("not-an-address", 0);
    ADD_FAILURE() << "a host name was taken as an address to listen on";
  } catch (const std::invalid_argument& e) {  // a mistake in the configuration, not a lost connection
    EXPECT_NE(std::string(e.what()).find("is not an IP address"), std::string::npos) << e.what();
  }
}

}  // namespace
