// supervision: actors that crash, come back, and eventually stay down.
//
//   - lifecycle hooks: on_start() and on_stop() are called when the class has them
//     (found at compile time; nothing to register),
//   - a restart policy: a worker that throws from a told method is re-created from its
//     original constructor arguments; refs held elsewhere reach the new instance,
//   - monitors: learn when an actor is gone for good (restarts exhausted), either from
//     outside (sys.monitor returns a future) or from another actor (its on_down hook).
//
// Why a tell and not an ask? An exception from an asked method goes back to the asker, who
// is there to handle it, and the actor carries on. An exception from a told method has
// nobody to go to: that is a failure of the actor, and the restart policy decides.
// (spawn_options::fail_on_ask_exception makes asked methods count as failures too.)

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <stdexcept>
#include <string>

#include <troupe/actors/actor_system.hpp>

namespace {

using namespace std::chrono_literals;

const char* reason_name(troupe::exit_reason r) {
  switch (r) {
    case troupe::exit_reason::stopped: return "stopped";
    case troupe::exit_reason::failed: return "failed";
    case troupe::exit_reason::shutdown: return "shutdown";
    case troupe::exit_reason::node_lost: return "node lost";
  }
  return "?";
}

class flaky_worker {
public:
  // Restarts call this constructor again with copies of the original arguments, so they
  // must be copyable. The counter lives outside the actor, so it survives restarts and
  // numbers the incarnations.
  flaky_worker(std::string name, std::atomic<int>* incarnations)
      : name_(std::move(name)), incarnation_(incarnations->fetch_add(1) + 1) {}

  // Hooks run on the actor, like its methods: on_start before any other message,
  // on_stop when this instance goes away (before a restart, or for good).
  void on_start() { std::printf("  [%s #%d] on_start\n", name_.c_str(), incarnation_); }
  void on_stop() {
    std::printf("  [%s #%d] on_stop after %d job(s)\n", name_.c_str(), incarnation_, jobs_);
  }

  void work(int /*job*/) { ++jobs_; }
  void crash(std::string why) { throw std::runtime_error(why); }

  int jobs() const { return jobs_; }
  int incarnation() const { return incarnation_; }

private:
  std::string name_;
  int incarnation_;
  int jobs_ = 0;  // state of this instance: a restart starts again from zero
};

// An actor that watches another. Having on_down is what makes it able to monitor.
class watchdog {
public:
  // The promise is only there so that main can wait for the report; actors themselves
  // would simply act on the notice.
  explicit watchdog(std::promise<troupe::down_notice>* report) : report_(report) {}

  void watch(troupe::actor_ref<flaky_worker> target) { troupe::this_actor::monitor(target); }

  void on_down(const troupe::down_notice& n) {
    ++notices_;
    std::printf("  [watchdog] on_down: actor %llu %s (%s)\n",
                static_cast<unsigned long long>(n.id), reason_name(n.reason), n.what.c_str());
    report_->set_value(n);
  }

  int notices() const { return notices_; }

private:
  std::promise<troupe::down_notice>* report_;
  int notices_ = 0;
};

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

int run() {
  // Declared before the system, so that they outlive the actors that point to them.
  std::atomic<int> incarnations{0};
  std::promise<troupe::down_notice> dog_report;
  auto dog_heard = dog_report.get_future();
  troupe::actor_system sys{{.threads = 2}};

  // Up to 3 restarts, the first after 10 ms, then 20 ms, 40 ms (backoff_multiplier 2).
  // The runtime logs each failure on stderr (TROUPE_LOG_LEVEL=off silences it).
  const troupe::spawn_options opts{
      .restart = {.max_restarts = 3, .backoff = std::chrono::milliseconds(10)}};
  std::printf("step 0: spawn the worker (restart policy: 3 restarts, 10 ms backoff)\n");
  auto worker = sys.spawn<flaky_worker>(opts, std::string("worker"), &incarnations);
  // on_start is the actor's first message, so any reply comes after it.
  check(worker.ask(&flaky_worker::incarnation).get() == 1, "first incarnation");

  // Two watchers: an actor, and main through a future. Neither hears of restarts: a down
  // notice means the actor is gone for good.
  auto dog = sys.spawn<watchdog>(&dog_report);
  dog.ask(&watchdog::watch, worker).get();
  troupe::future<troupe::down_notice> down = sys.monitor(worker);

  std::printf("step 1: three jobs for the first incarnation\n");
  for (int job = 1; job <= 3; ++job) worker.tell(&flaky_worker::work, job);
  int jobs = worker.ask(&flaky_worker::jobs).get();
  std::printf("  jobs done: %d\n", jobs);
  check(jobs == 3, "three jobs");

  std::printf("step 2: a crash, then one more job through the same ref\n");
  worker.tell(&flaky_worker::crash, std::string("bad input #1"));
  // Sent while the worker is failing or waiting out its backoff: queued messages are kept
  // and handled by the new instance.
  worker.tell(&flaky_worker::work, 4);
  int incarnation = worker.ask(&flaky_worker::incarnation).get();
  jobs = worker.ask(&flaky_worker::jobs).get();
  std::printf("  same ref now reaches incarnation #%d, which has done %d job(s)\n", incarnation,
              jobs);
  check(incarnation == 2, "restarted once");
  check(jobs == 1, "the new instance starts from fresh state and got the queued job");
  check(worker.alive() && !down.ready(), "a restart is not a down");

  std::printf("step 3: three more crashes; the last one exceeds max_restarts = 3\n");
  for (int i = 2; i <= 4; ++i) worker.tell(&flaky_worker::crash, "bad input #" + std::to_string(i));

  // The monitor's future is a future like any other: a timeout keeps a bug from hanging us.
  troupe::down_notice n = std::move(down).timeout(5s).get();
  check(dog_heard.wait_for(5s) == std::future_status::ready, "the watchdog was told");
  troupe::down_notice dog_n = dog_heard.get();
  std::printf("  sys.monitor: actor %llu %s (%s)\n", static_cast<unsigned long long>(n.id),
              reason_name(n.reason), n.what.c_str());
  check(n.id == worker.id() && n.reason == troupe::exit_reason::failed, "down notice: failed");
  check(n.what == "bad input #4", "down notice carries the last failure");
  check(dog_n.id == worker.id() && dog_n.reason == troupe::exit_reason::failed,
        "watchdog notice: failed");
  check(incarnations.load() == 4, "one original and three restarts");

  // Gone for good: tells go to the dead letters, asks fail with errc::actor_dead.
  check(!worker.alive(), "not alive any more");
  try {
    worker.ask(&flaky_worker::jobs).get();
    check(false, "an ask to a dead actor should fail");
  } catch (const troupe::error& e) {
    std::printf("step 4: asking the dead worker -> %s\n", e.what());
    check(e.code_value() == troupe::errc::actor_dead, "errc::actor_dead");
  }
  int notices = dog.ask(&watchdog::notices).get();
  check(notices == 1, "exactly one down notice, no matter how many restarts");

  std::printf("supervision: all checks passed\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "supervision: FAILED: %s\n", e.what());
    return 1;
  }
}
