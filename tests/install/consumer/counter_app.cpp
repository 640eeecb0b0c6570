// The README's tour, as a user writes it: a plain class as an actor, tell, ask, and a
// coroutine method that awaits another actor's replies. Exits 1 when a result is off.
#include <cstdio>
#include <exception>

#include <troupe/actors/actor_system.hpp>

class counter {  // a plain class: no base class, no macro
public:
  explicit counter(int start) : value_(start) {}
  int add(int x) { return value_ += x; }

private:
  int value_;
};

struct pinger {
  troupe::actor_ref<counter> peer;
  troupe::task<int> twice(int x) {
    int a = co_await peer.ask(&counter::add, x);
    co_return co_await peer.ask(&counter::add, a);
  }
};

int main() {
  try {
    troupe::actor_system sys{{.threads = 2}};
    auto c = sys.spawn<counter>(10);
    c.tell(&counter::add, 1);
    const int v = c.ask(&counter::add, 2).get();  // 10 + 1 + 2
    auto p = sys.spawn<pinger>(pinger{c});
    const int w = p.ask(&pinger::twice, 5).get();  // a = 13 + 5 = 18, then 18 + 18
    std::printf("counter: ask after tell gave %d\n", v);
    std::printf("pinger: twice(5) gave %d\n", w);
    if (v != 13 || w != 36) {
      std::printf("counter_app: FAILED: expected 13 and 36\n");
      return 1;
    }
    std::printf("counter_app: ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "counter_app: FAILED: %s\n", e.what());
    return 1;
  }
}
