#pragma once
/// @file
/// The one error model of troupe: expected failures inside the framework are values of
/// `troupe::errc`, in their own `std::error_category`, and reach user code as a
/// `troupe::error` exception at the ask boundary (`.get()`, `co_await`).

#include <string>
#include <system_error>

namespace troupe {

/// Expected failures of the framework. Numbering is stable: it travels on the wire.
enum class errc : int {
  ok = 0,
  actor_dead = 1,         ///< the target actor stopped or died before it handled the message
  mailbox_full = 2,       ///< a bounded mailbox refused the message (overflow policy `reject`)
  timeout = 3,            ///< an ask's deadline passed before the reply arrived
  decode_error = 4,       ///< bytes on the wire could not be decoded
  connection_lost = 5,    ///< the connection to another node dropped
  node_lost = 6,          ///< another node stopped answering heartbeats
  would_deadlock = 7,     ///< a blocking wait was refused (for example `.get()` on an actor thread)
  type_mismatch = 8,      ///< a named actor has another type than the one asked for
  system_shutdown = 9,    ///< the actor system is shutting down
  broken_promise = 10,    ///< a reply can never arrive (its sender was destroyed unanswered)
  name_taken = 11,        ///< a name is already registered to another actor
  remote_exception = 12,  ///< a method on another node threw; the message says what
  message_too_large = 13, ///< a message (or reply) to another node is larger than a frame may be
};

/// The category of `troupe::errc`; its name is "troupe".
const std::error_category& error_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// The exception that carries an `errc` to user code.
class error : public std::system_error {
public:
  explicit error(errc e) : std::system_error(make_error_code(e)) {}
  error(errc e, const std::string& what) : std::system_error(make_error_code(e), what) {}
  /// The troupe error code carried by this exception.
  errc code_value() const noexcept { return static_cast<errc>(code().value()); }
};

}  // namespace troupe

template <>
struct std::is_error_code_enum<troupe::errc> : std::true_type {};
