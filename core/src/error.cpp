#include "troupe/core/error.hpp"

namespace troupe {
namespace {

class category final : public std::error_category {
public:
  const char* name() const noexcept override { return "troupe"; }
  std::string message(int v) const override {
    switch (static_cast<errc>(v)) {
      case errc::ok: return "ok";
      case errc::actor_dead: return "the target actor is dead";
      case errc::mailbox_full: return "the target actor's mailbox is full";
      case errc::timeout: return "the ask timed out";
      case errc::decode_error: return "malformed data could not be decoded";
      case errc::connection_lost: return "the connection was lost";
      case errc::node_lost: return "the node was lost";
      case errc::would_deadlock: return "a blocking wait here would deadlock";
      case errc::type_mismatch: return "the actor has another type";
      case errc::system_shutdown: return "the actor system is shutting down";
      case errc::broken_promise: return "the reply can never arrive";
      case errc::name_taken: return "the name is already registered";
      case errc::remote_exception: return "a method on another node threw";
      case errc::message_too_large: return "the message is larger than a frame may be";
    }
    return "unknown troupe error " + std::to_string(v);
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const category instance;
  return instance;
}

}  // namespace troupe
