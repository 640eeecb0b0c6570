#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <troupe/actors/actor_system.hpp>
#include <troupe/core/trace.hpp>

namespace {

struct traced_actor {
  int work(int x) { return x + 1; }
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(Trace, RecordsEveryHandlerRunAsChromeTraceEvents) {
  const std::string path = ::testing::TempDir() + "troupe_trace_test.json";
  std::remove(path.c_str());
  troupe::trace::start(path);
  ASSERT_TRUE(troupe::trace::enabled());
  {
    troupe::test_system sys;
    auto a = sys.spawn<traced_actor>();
    for (int i = 0; i < 5; ++i) a.tell(&traced_actor::work, i);
    EXPECT_EQ(a.ask(&traced_actor::work, 1).get(), 2);
  }
  // Names are JSON strings, whatever they hold.
  troupe::trace::record("a \"quoted\" back\\slash\n", "test", troupe::trace::now_ns(), 1, 7);
  troupe::trace::stop();
  EXPECT_FALSE(troupe::trace::enabled());
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << "no trace file at " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  EXPECT_EQ(text.rfind("{\"traceEvents\":[", 0), 0u);
  EXPECT_NE(text.find("\"displayTimeUnit\""), std::string::npos);
  // Five tells and one ask of this actor type, each a complete ("X") event.
  EXPECT_EQ(count(text, "traced_actor\",\"cat\":\"tell\",\"ph\":\"X\""), 5u);
  EXPECT_EQ(count(text, "traced_actor\",\"cat\":\"ask\",\"ph\":\"X\""), 1u);
  EXPECT_EQ(count(text, "{\"name\":\"a \\\"quoted\\\" back\\\\slash\\u000a\",\"cat\":\"test\""), 1u) << text;
  std::remove(path.c_str());
}

}  // namespace
