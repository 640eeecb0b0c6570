#include "troupe/federated/psi.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace troupe::federated {
namespace {

constexpr std::string_view psi_domain = "troupe/psi/v1";

/// Runs body(begin, end) over consecutive ranges that cover [0, n), on up to `threads` threads
/// (the caller's among them); rethrows the first exception one of them threw.
template <class F>
void parallel_ranges(std::size_t n, unsigned threads, F body) {
  const std::size_t parts = std::max<std::size_t>(1, std::min<std::size_t>(threads, n / 256 + 1));
  std::exception_ptr first;
  std::mutex m;
  auto run = [&](std::size_t part) {
    try {
      body(n * part / parts, n * (part + 1) / parts);
    } catch (...) {
      std::lock_guard lock(m);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  for (std::size_t p = 1; p < parts; ++p) helpers.emplace_back(run, p);
  run(0);
  for (auto& t : helpers) t.join();
  if (first) std::rethrow_exception(first);
}

std::vector<ristretto::element> elements_of(std::span<const std::byte> message, const char* what) {
  if (message.size() % ristretto::element_bytes != 0)
    throw std::invalid_argument(std::string("PSI: the peer's ") + what + " is " + std::to_string(message.size()) +
                                " bytes, not a whole number of 32-byte ristretto255 elements");
  std::vector<ristretto::element> out(message.size() / ristretto::element_bytes);
  if (!out.empty()) std::memcpy(out.data(), message.data(), message.size());
  return out;
}

std::vector<std::byte> bytes_of(const std::vector<ristretto::element>& elements) {
  std::vector<std::byte> out(elements.size() * ristretto::element_bytes);
  if (!out.empty()) std::memcpy(out.data(), elements.data(), out.size());
  return out;
}

}  // namespace

psi_party::psi_party(std::vector<std::uint64_t> ids, unsigned threads)
    : ids_(std::move(ids)),
      threads_(threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency())),
      key_(ristretto::random_scalar()) {
  if (ids_.size() > 0xffffffffu) throw std::invalid_argument("PSI: more than 2^32 IDs");
  auto sorted = ids_;
  std::sort(sorted.begin(), sorted.end());
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end())
    throw std::invalid_argument("PSI: the ID " + std::to_string(*dup) + " appears more than once in a party's set");
}

std::vector<std::byte> psi_party::blinded_ids() {
  // A uniformly random order (Fisher-Yates from the secure generator): the position of an
  // element says nothing about which ID it blinds.
  order_.resize(ids_.size());
  for (std::uint32_t i = 0; i < order_.size(); ++i) order_[i] = i;
  for (std::size_t i = order_.size(); i > 1; --i)
    std::swap(order_[i - 1], order_[ristretto::random_below(static_cast<std::uint32_t>(i))]);
  std::vector<ristretto::element> out(ids_.size());
  // Each range hashes and blinds its IDs in one batch (hash_and_multiply: the same bytes as
  // multiply(key_, hash_to_element(...)) one by one).
  parallel_ranges(out.size(), threads_, [&](std::size_t begin, std::size_t end) {
    std::vector<std::array<std::byte, 8>> id(end - begin);
    std::vector<std::span<const std::byte>> messages(end - begin);
    for (std::size_t i = begin; i < end; ++i) {
      for (int b = 0; b < 8; ++b) id[i - begin][b] = static_cast<std::byte>(ids_[order_[i]] >> (8 * b));  // little-endian
      messages[i - begin] = id[i - begin];
    }
    const auto blinded = ristretto::hash_and_multiply(key_, psi_domain, messages);
    std::copy(blinded.begin(), blinded.end(), out.begin() + static_cast<std::ptrdiff_t>(begin));
  });
  sent_ = true;
  return bytes_of(out);
}

std::vector<std::byte> psi_party::blind_peer(std::span<const std::byte> peer_first) {
  auto in = elements_of(peer_first, "first message");
  std::vector<ristretto::element> out(in.size());
  try {
    parallel_ranges(in.size(), threads_, [&](std::size_t begin, std::size_t end) {
      const auto blinded = ristretto::multiply_each(key_, std::span(in).subspan(begin, end - begin));
      std::copy(blinded.begin(), blinded.end(), out.begin() + static_cast<std::ptrdiff_t>(begin));
    });
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("PSI: the peer's first message holds an invalid element (") + e.what() + ")");
  }
  auto sorted = out;
  std::sort(sorted.begin(), sorted.end());
  // Equal blinded elements mean a repeated ID: an honest peer never sends one.
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw std::invalid_argument("PSI: the peer's first message repeats an element");
  peer_ = std::move(sorted);
  blinded_peer_ = true;
  return bytes_of(out);
}

std::vector<std::uint64_t> psi_party::intersect(std::span<const std::byte> peer_second) {
  if (!sent_ || !blinded_peer_) throw std::logic_error("PSI: intersect() before blinded_ids() and blind_peer()");
  auto mine = elements_of(peer_second, "second message");
  if (mine.size() != ids_.size())
    throw std::invalid_argument("PSI: the peer's second message has " + std::to_string(mine.size()) +
                                " elements, but this party sent " + std::to_string(ids_.size()));
  // An element equal to one of the peer's doubly blinded ones is valid (this party computed
  // that one); only the others need decoding to tell a malformed message from a missing ID.
  std::vector<char> found(mine.size());
  parallel_ranges(mine.size(), threads_, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i)
      found[i] = std::binary_search(peer_.begin(), peer_.end(), mine[i]) ? 1 : ristretto::is_valid(mine[i]) ? 0 : 2;
  });
  if (auto bad = std::find(found.begin(), found.end(), 2); bad != found.end())
    throw std::invalid_argument("PSI: element " + std::to_string(bad - found.begin()) +
                                " of the peer's second message is not a valid ristretto255 element");
  std::vector<std::uint64_t> common;
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (found[i] == 1) common.push_back(ids_[order_[i]]);
  std::sort(common.begin(), common.end());
  return common;
}

psi_outcome run_psi(std::vector<std::uint64_t> ids_a, std::vector<std::uint64_t> ids_b, unsigned threads) {
  const auto t0 = std::chrono::steady_clock::now();
  psi_party a(std::move(ids_a), threads), b(std::move(ids_b), threads);
  const auto a1 = a.blinded_ids(), b1 = b.blinded_ids();
  const auto a2 = a.blind_peer(b1), b2 = b.blind_peer(a1);
  psi_outcome out;
  out.intersection = a.intersect(b2);
  if (b.intersect(a2) != out.intersection)
    throw std::logic_error("PSI: the two parties computed different intersections");
  out.size_a = a.size();
  out.size_b = b.size();
  out.transcript_bytes = a1.size() + b1.size() + a2.size() + b2.size();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace troupe::federated
