#pragma once
/// @file
/// `troupe::encoded_pieces`: an encoding whose long runs stay in their owners' memory (see
/// byte_writer::write_shared in codec.hpp), for transports that write them with one gathered write.
/// Standard library only.

#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace troupe {

/// An encoded value in pieces: the writer's own bytes, with runs of shared memory spliced in at
/// offsets of them instead of copied. Written in order, the pieces are the encoding.
struct encoded_pieces {
  /// A run of memory that goes at offset `at` of `bytes`, kept alive by `owner`.
  struct splice {
    std::size_t at = 0;
    std::shared_ptr<const void> owner;
    std::span<const std::byte> run;
  };
  std::vector<std::byte> bytes;
  std::vector<splice> splices;  ///< in order of `at`

  /// The encoding's length: own bytes and spliced runs.
  std::size_t size() const noexcept {
    std::size_t n = bytes.size();
    for (const auto& s : splices) n += s.run.size();
    return n;
  }
  /// Calls `f(std::span<const std::byte>)` for each non-empty piece, in order.
  template <class F>
  void for_each_piece(F&& f) const {
    std::size_t from = 0;
    for (const auto& s : splices) {
      if (s.at > from) f(std::span<const std::byte>(bytes).subspan(from, s.at - from));
      if (!s.run.empty()) f(s.run);
      from = s.at;
    }
    if (bytes.size() > from) f(std::span<const std::byte>(bytes).subspan(from));
  }
  /// The encoding as one buffer (the spliced runs copied in).
  std::vector<std::byte> flatten() && {
    if (splices.empty()) return std::move(bytes);
    std::vector<std::byte> out;
    out.reserve(size());
    for_each_piece([&](std::span<const std::byte> p) { out.insert(out.end(), p.begin(), p.end()); });
    splices.clear();
    bytes.clear();
    return out;
  }
};

}  // namespace troupe
