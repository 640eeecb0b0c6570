#pragma once
// Remote calls, the caller's side: the calls this node made to other nodes that wait for their
// reply. The node sends the calls and hands the replies over (node_runtime::call, on_reply in
// calls.cpp); this table only files them.

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "troupe/actors/detail/remote_handle.hpp"

namespace troupe::detail {

/// The calls that wait for their reply, by request id. Not thread-safe: the node uses it under
/// its mutex.
class reply_table {
public:
  /// Files a call to node `to`; `written` when it goes to a connection now (not to a backlog
  /// that waits for one). Returns the call's request id.
  std::uint64_t add(node_id to, std::unique_ptr<reply_sink> sink, bool written) {
    auto request = next_request_++;
    pending_.emplace(request, pending_call{to, std::move(sink), written});
    return request;
  }
  /// Call `request` left its backlog for a connection.
  void mark_written(std::uint64_t request) {
    if (auto p = pending_.find(request); p != pending_.end()) p->second.written = true;
  }
  /// The sink of call `request`, taken out, when `from` is the node it was made to. Null when
  /// no call waits under that id (it timed out or failed already: `made_to` is 0), or when the
  /// call was made to another node (`made_to` says which; the call still waits).
  std::unique_ptr<reply_sink> take_reply(std::uint64_t request, node_id from, node_id& made_to) {
    made_to = 0;
    auto it = pending_.find(request);
    if (it == pending_.end()) return nullptr;
    made_to = it->second.to;
    if (made_to != from) return nullptr;
    auto sink = std::move(it->second.sink);
    pending_.erase(it);
    return sink;
  }
  /// Takes out the calls to node `id` (only those handed to a connection when `written_only`).
  std::vector<std::unique_ptr<reply_sink>> take_calls_to(node_id id, bool written_only) {
    std::vector<std::unique_ptr<reply_sink>> out;
    for (auto p = pending_.begin(); p != pending_.end();) {
      if (p->second.to == id && (p->second.written || !written_only)) {
        out.push_back(std::move(p->second.sink));
        p = pending_.erase(p);
      } else {
        ++p;
      }
    }
    return out;
  }
  /// Takes out every call.
  std::vector<std::unique_ptr<reply_sink>> take_all() {
    std::vector<std::unique_ptr<reply_sink>> out;
    for (auto& [id, p] : pending_) out.push_back(std::move(p.sink));
    pending_.clear();
    return out;
  }

private:
  struct pending_call {
    node_id to;
    std::unique_ptr<reply_sink> sink;
    bool written;  // handed to a connection (not waiting in a backlog)
  };
  std::uint64_t next_request_ = 1;
  std::unordered_map<std::uint64_t, pending_call> pending_;
};

}  // namespace troupe::detail
