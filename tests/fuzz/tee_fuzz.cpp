// libFuzzer target for what the enclave decodes from bytes others chose (`make fuzz`): a sealed
// update's plaintext (tee::decode_payload and the enclave's in-place decode_payload_view, after
// the box opened: a client may still send any bytes) and a TPM quote's TPMS_ATTEST (tee::check_tpm_attest). Hostile bytes must never crash
// or hang; a refusal is std::invalid_argument (the payload) or a reason (the quote); whatever is
// accepted must keep the decoder's promises (the oracle below).
//
// The first input byte chooses the decoder: even, a payload; odd, a TPMS_ATTEST.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tee_payload.hpp"
#include "tee_tpm.hpp"
#include "openssl_ptr.hpp"

using namespace troupe::federated::tee;

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "tee_fuzz: %s\n", what.c_str());
  std::abort();
}

void check_payload(std::span<const std::uint8_t> data) {
  // The in-place view (what the enclave uses) on an aligned copy: it must accept and refuse what
  // the copying decoder does, and see the same fields.
  std::vector<std::uint32_t> aligned((data.size() + 3) / 4);
  if (!data.empty()) std::memcpy(aligned.data(), data.data(), data.size());
  bool view_ok = true;
  payload_view v;
  try {
    v = decode_payload_view({reinterpret_cast<const std::uint8_t*>(aligned.data()), data.size()});
  } catch (const std::invalid_argument&) {
    view_ok = false;
  }
  update_payload p;
  try {
    p = decode_payload(data);
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).rfind("tee update: ", 0) != 0) broken(std::string("a refusal without its prefix: ") + e.what());
    if (view_ok) broken("the view accepted what the copying decoder refused");
    return;
  }
  if (!view_ok) broken("the view refused what the copying decoder accepted");
  if (v.round != p.round || v.client != p.client || std::memcmp(&v.weight, &p.weight, sizeof p.weight) != 0 || v.dim != p.dim ||
      v.sparse != p.sparse || v.index.size() != p.index.size() || v.value.size() != p.value.size() ||
      (!p.index.empty() && std::memcmp(v.index.data(), p.index.data(), p.index.size() * 4) != 0) ||
      (!p.value.empty() && std::memcmp(v.value.data(), p.value.data(), p.value.size() * 4) != 0))
    broken("the view and the copying decoder disagree");
  // What decodes encodes back to the same bytes.
  const auto again = encode_payload(p);
  if (again.size() != data.size() || std::memcmp(again.data(), data.data(), data.size()) != 0) broken("decode then encode changed the bytes");
  if (!p.sparse && p.value.size() != p.dim) broken("a dense update of another length");
  if (p.sparse && p.index.size() != p.value.size()) broken("positions and values of different counts");
  // A sparse update of a small dimension: the plain and the oblivious densification agree, or
  // both refuse a position outside it.
  if (p.sparse && p.dim <= 4096 && p.index.size() <= 256) {
    std::vector<float> plain(p.dim), oblivious(p.dim);
    bool plain_ok = true, oblivious_ok = true;
    try {
      densify(p.index, p.value, plain, false);
    } catch (const std::invalid_argument&) {
      plain_ok = false;
    }
    try {
      densify(p.index, p.value, oblivious, true);
    } catch (const std::invalid_argument&) {
      oblivious_ok = false;
    }
    if (plain_ok != oblivious_ok) broken("one densification refused what the other took");
    // Equal bits (a repeated position keeps its last entry's value in both).
    if (plain_ok && !plain.empty() && std::memcmp(plain.data(), oblivious.data(), plain.size() * sizeof(float)) != 0)
      broken("the plain and the oblivious densification differ");
  }
}

void check_attest(std::span<const std::uint8_t> data) {
  std::array<std::uint8_t, 32> qualifying{}, pcr{};
  qualifying.fill(0x33);
  pcr.fill(0x44);
  const auto why = check_tpm_attest(data, qualifying, pcr);
  if (!why.empty()) return;
  // The fuzzer can learn the digests from the comparisons, so an accepted quote is possible; it
  // must then be a quote of exactly this data: the magic and type, the qualifying bytes right
  // after the signer's name, and the SHA-256 of the PCR value as its last 32 bytes.
  static const std::array<std::uint8_t, 4> magic{0xff, 0x54, 0x43, 0x47};
  if (data.size() < 6 + 2 + 2 + 32 + 25 + 10 + 2 + 32 || std::memcmp(data.data(), magic.data(), 4) != 0 || data[4] != 0x80 ||
      data[5] != 0x18)
    broken("an attestation accepted without the quote's header");
  const std::size_t signer = (std::size_t(data[6]) << 8) | data[7];
  if (data.size() < 8 + signer + 2 + 32 || std::memcmp(data.data() + 8 + signer + 2, qualifying.data(), 32) != 0)
    broken("an attestation accepted without the qualifying data");
  const auto want = troupe::federated::detail::ossl::sha256(pcr);
  if (std::memcmp(data.data() + data.size() - 32, want.data(), 32) != 0) broken("an attestation accepted without the expected PCR digest");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::span<const std::uint8_t> rest(data + 1, size - 1);
  if (data[0] % 2 == 0)
    check_payload(rest);
  else
    check_attest(rest);
  return 0;
}
