// hello: the first steps with troupe.
//
//   1. spawn an actor (an ordinary C++ class),
//   2. tell it something (fire and forget),
//   3. ask it something and wait for the reply from main,
//   4. see an exception thrown by a method arrive at the caller,
//   5. give up on a slow reply with a timeout.
//
// An actor is a plain object whose methods the runtime calls one at a time, on one of the
// system's worker threads. You never lock its state: only its own methods touch it, and
// never two at once.

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include <troupe/actors/actor_system.hpp>

namespace {

class greeter {
public:
  explicit greeter(std::string greeting) : greeting_(std::move(greeting)) {}

  // Called with tell: nobody waits for it, so it returns nothing.
  void remember(std::string name) { last_name_ = std::move(name); }

  // Called with ask: the return value travels back to the caller in a future.
  std::string greet(std::string name) {
    ++greeted_;
    return greeting_ + ", " + name + "!";
  }

  std::string last_name() const { return last_name_; }
  int greeted() const { return greeted_; }

  // An exception thrown by an asked method is caught by the runtime and rethrown to the
  // caller. The actor itself carries on (see spawn_options::fail_on_ask_exception for the
  // stricter alternative).
  int divide(int a, int b) {
    if (b == 0) throw std::invalid_argument("greeter::divide: division by zero");
    return a / b;
  }

  // A deliberately slow method. Sleeping in an actor holds a worker thread hostage, so real
  // code should not do it; here it stands in for "work that takes a while".
  int slow_answer() {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return 42;
  }

private:
  std::string greeting_;
  std::string last_name_;
  int greeted_ = 0;
};

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

int run() {
  // Two worker threads run every actor of this system. The destructor (end of scope)
  // stops the actors and joins the workers.
  troupe::actor_system sys{{.threads = 2}};

  // 1. spawn: the arguments go to greeter's constructor. What you get back is an
  //    actor_ref<greeter>, a copyable address, not the object itself.
  auto g = sys.spawn<greeter>(std::string("Hello"));
  std::printf("spawned greeter, actor id %llu\n", static_cast<unsigned long long>(g.id()));

  // 2. tell: queue a call and return at once. Arguments are moved into the message
  //    (they are stored decayed: pass a std::string, not a pointer to a temporary buffer).
  g.tell(&greeter::remember, std::string("Ada"));

  // 3. ask: queue a call and get a future of its result. get() blocks this thread until
  //    the reply is there. Messages from one sender arrive in the order they were sent,
  //    so the tell above has been handled by the time this ask runs.
  std::string reply = g.ask(&greeter::greet, std::string("world")).get();
  std::string remembered = g.ask(&greeter::last_name).get();
  std::printf("ask greet -> \"%s\"\n", reply.c_str());
  std::printf("ask last_name (after the tell) -> \"%s\"\n", remembered.c_str());
  check(reply == "Hello, world!", "greet reply");
  check(remembered == "Ada", "tell was handled before the later ask");

  // get() is for threads outside the actors (main, a test, a request handler). Inside an
  // actor's method, calling get() would park a worker thread that other actors need, and
  // could deadlock the system; troupe refuses it and throws
  // troupe::error(errc::would_deadlock). Inside actors, use `co_await fut` in a method
  // returning troupe::task<T>, or `std::move(fut).then(...)`: see examples/ping_pong.

  // 4. An exception thrown by the method reaches the caller at get().
  try {
    g.ask(&greeter::divide, 1, 0).get();
    check(false, "divide by zero should have thrown");
  } catch (const std::invalid_argument& e) {
    std::printf("ask divide(1, 0) threw to the caller: %s\n", e.what());
  }
  // ... and the actor is still alive and well.
  int q = g.ask(&greeter::divide, 84, 2).get();
  std::printf("ask divide(84, 2) afterwards -> %d (the actor survived)\n", q);
  check(q == 42 && g.alive(), "actor survives an exception from an asked method");

  // 5. timeout: the future fails with troupe::error(errc::timeout) when no reply has come
  //    after the deadline. The call itself still runs; its late reply is thrown away.
  auto t0 = std::chrono::steady_clock::now();
  try {
    g.ask(&greeter::slow_answer).timeout(std::chrono::milliseconds(50)).get();
    check(false, "slow_answer should have timed out");
  } catch (const troupe::error& e) {
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - t0);
    std::printf("ask slow_answer with a 50 ms timeout -> troupe::error after %lld ms: %s\n",
                static_cast<long long>(waited.count()), e.what());
    check(e.code_value() == troupe::errc::timeout, "error code is errc::timeout");
  }
  // The actor finishes the slow call, then takes the next message: this ask waits for it.
  int greeted = g.ask(&greeter::greeted).get();
  std::printf("ask greeted -> %d\n", greeted);
  check(greeted == 1, "one greeting");

  std::printf("hello: all checks passed\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hello: FAILED: %s\n", e.what());
    return 1;
  }
}
