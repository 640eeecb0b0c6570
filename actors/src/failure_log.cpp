// The actors' failures and restarts for the status report (failure_log.hpp).

#include "failure_log.hpp"

#include <chrono>

namespace troupe::detail {

void failure_log::record(actor_id id, const char* type, bool restarted, std::uint32_t restarts,
                         const std::string& what) noexcept {
  // Called while a failure is handled: out of memory here drops the entry, never the process.
  try {
    const auto now =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
    actor_failure f{0, now.count(), id, type, restarted, restarts, what.substr(0, what_limit)};
    std::lock_guard lock(mu_);
    f.seq = ++seq_;
    auto t = types_.find(f.type);
    if (t == types_.end()) t = types_.emplace(f.type, actor_type_failures{f.type, 0, 0}).first;
    ++(restarted ? t->second.restarts : t->second.failed);
    recent_.push_back(std::move(f));
    if (recent_.size() > kept) recent_.pop_front();
  } catch (...) {
  }
}

std::vector<actor_type_failures> failure_log::by_type() const {
  std::lock_guard lock(mu_);
  std::vector<actor_type_failures> out;
  out.reserve(types_.size());
  for (auto& [type, t] : types_) out.push_back(t);
  return out;
}

std::vector<actor_failure> failure_log::recent() const {
  std::lock_guard lock(mu_);
  return {recent_.begin(), recent_.end()};
}

}  // namespace troupe::detail
