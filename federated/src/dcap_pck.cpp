// The PCK certificate's SGX extensions (Intel SGX PCK Certificate and Certificate Revocation List
// Profile Specification, section "SGX Extensions"): a SEQUENCE of SEQUENCE { OID, value } under
// OID 1.2.840.113741.1.13.1, read with a bounds-checked DER reader of its own (the few types it
// holds: SEQUENCE, OBJECT IDENTIFIER, INTEGER, OCTET STRING, ENUMERATED).

#include "dcap_pck.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::federated::dcap::detail {
namespace {

[[noreturn]] void bad(const std::string& why) { throw std::runtime_error("the PCK certificate's SGX extensions: " + why); }

constexpr std::uint8_t tag_integer = 0x02, tag_octets = 0x04, tag_oid = 0x06, tag_sequence = 0x30;

// 1.2.840.113741.1.13.1 as DER contents; its items append one arc below 128.
const std::uint8_t sgx_oid[] = {0x2a, 0x86, 0x48, 0x86, 0xf8, 0x4d, 0x01, 0x0d, 0x01};

struct tlv {
  std::uint8_t tag;
  std::span<const std::uint8_t> value;
};

class der {
public:
  explicit der(std::span<const std::uint8_t> d) : d_(d) {}
  bool done() const noexcept { return at_ == d_.size(); }
  tlv next() {
    if (d_.size() - at_ < 2) bad("truncated DER");
    const std::uint8_t tag = d_[at_++];
    if ((tag & 0x1f) == 0x1f) bad("a multi-byte DER tag");
    std::size_t len = d_[at_++];
    if (len & 0x80) {
      const std::size_t n = len & 0x7f;
      if (n == 0 || n > 4) bad("a DER length of " + std::to_string(n) + " bytes");
      if (d_.size() - at_ < n) bad("truncated DER length");
      len = 0;
      for (std::size_t i = 0; i < n; ++i) len = len << 8 | d_[at_++];
    }
    if (len > d_.size() - at_) bad("a DER value longer than what holds it");
    tlv t{tag, d_.subspan(at_, len)};
    at_ += len;
    return t;
  }
  tlv next(std::uint8_t tag, const char* what) {
    auto t = next();
    if (t.tag != tag) bad(std::string(what) + " has DER tag " + std::to_string(t.tag) + ", not " + std::to_string(tag));
    return t;
  }

private:
  std::span<const std::uint8_t> d_;
  std::size_t at_ = 0;
};

// The arc below 1.2.840.113741.1.13.1 that `oid` adds (`prefix` may name a deeper parent), or -1.
int arc_below(std::span<const std::uint8_t> oid, std::span<const std::uint8_t> prefix) {
  if (oid.size() != prefix.size() + 1 || std::memcmp(oid.data(), prefix.data(), prefix.size()) != 0) return -1;
  return oid.back() < 0x80 ? oid.back() : -1;
}

std::uint32_t unsigned_integer(const tlv& t, std::uint32_t max, const char* what) {
  if (t.tag != tag_integer) bad(std::string(what) + " is not an INTEGER");
  if (t.value.empty() || t.value.size() > 5) bad(std::string(what) + " has an INTEGER of " + std::to_string(t.value.size()) + " bytes");
  if (t.value[0] & 0x80) bad(std::string(what) + " is negative");
  std::uint64_t v = 0;
  for (auto b : t.value) v = v << 8 | b;
  if (v > max) bad(std::string(what) + " is " + std::to_string(v) + ", above " + std::to_string(max));
  return static_cast<std::uint32_t>(v);
}

}  // namespace

pck_extensions parse_pck_extensions(std::span<const std::uint8_t> extension_value) {
  pck_extensions p;
  bool tcb = false, pce = false, fmspc = false;
  der outer(extension_value);
  der items(outer.next(tag_sequence, "the extension").value);
  if (!outer.done()) bad("bytes after the extension's SEQUENCE");
  std::vector<std::uint8_t> tcb_oid(std::begin(sgx_oid), std::end(sgx_oid));
  tcb_oid.push_back(2);
  while (!items.done()) {
    der item(items.next(tag_sequence, "an item").value);
    const auto oid = item.next(tag_oid, "an item's name").value;
    const auto value = item.next();
    const int arc = arc_below(oid, sgx_oid);
    if (arc == 2) {
      if (value.tag != tag_sequence) bad("the TCB is not a SEQUENCE");
      der parts(value.value);
      unsigned seen = 0;
      while (!parts.done()) {
        der part(parts.next(tag_sequence, "a TCB component").value);
        const int n = arc_below(part.next(tag_oid, "a TCB component's name").value, tcb_oid);
        const auto v = part.next();
        if (n >= 1 && n <= 16) {
          p.tcb_components[static_cast<std::size_t>(n - 1)] = static_cast<std::uint8_t>(unsigned_integer(v, 255, "a TCB component SVN"));
        } else if (n == 17) {
          p.pcesvn = unsigned_integer(v, 65535, "PCESVN");
        } else if (n == 18) {
          if (v.tag != tag_octets || v.value.size() != 16) bad("CPUSVN is not 16 octets");
          std::memcpy(p.cpusvn.data(), v.value.data(), 16);
        } else {
          continue;
        }
        seen |= 1u << (n - 1);
      }
      if (seen != (1u << 18) - 1) bad("the TCB lacks some of its 16 component SVNs, PCESVN or CPUSVN");
      tcb = true;
    } else if (arc == 3) {
      if (value.tag != tag_octets || value.value.size() != 2) bad("PCE-ID is not 2 octets");
      p.pce_id.assign(value.value.begin(), value.value.end());
      pce = true;
    } else if (arc == 4) {
      if (value.tag != tag_octets || value.value.size() != 6) bad("FMSPC is not 6 octets");
      p.fmspc.assign(value.value.begin(), value.value.end());
      fmspc = true;
    }
  }
  if (!tcb || !pce || !fmspc) bad("the TCB, PCE-ID or FMSPC is missing");
  return p;
}

}  // namespace troupe::federated::dcap::detail
