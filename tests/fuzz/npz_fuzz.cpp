// libFuzzer target for load_npz and its .npy reader (`make fuzz`). Hostile bytes must never
// crash, hang or allocate past what they can hold; a refusal is a std::runtime_error that names
// the archive; whatever is accepted must keep load_npz's promises (the oracle below), and an
// accepted .npy array must read back the same after being written again in NumPy's form.
//
// The first input byte chooses what the rest is: even, an .npz archive for load_npz_bytes; odd,
// one .npy array for read_npy_bytes in the role (byte / 2) % 3 (features, labels, clients).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "labelled.hpp"
#include "npz.hpp"

using namespace troupe;
using detail::npy_role;

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "npz_fuzz: %s\n", what.c_str());
  std::abort();
}

void check_refusal(const std::runtime_error& e, const std::string& where) {
  const std::string message = e.what();
  if (message.rfind(where, 0) != 0 || message.size() <= where.size() + 2)
    broken("a refusal that does not name its source and a reason: " + message);
}

// load_npz's promises about what it returns.
void check_accepted(const labelled_data& d) {
  const tensor& x = d.train.images;
  if (x.type() != dtype::u8 && x.type() != dtype::f32) broken("images of another dtype");
  if (x.rank() < 2 || x.rank() > detail::max_image_rank || x.dim(0) < 1) broken("images of a bad shape");
  if (d.test.images.type() != x.type() || d.test.images.rank() != x.rank()) broken("splits that disagree");
  if (d.classes < 2 || d.classes > 256) broken("classes outside 2..256");
  for (const dataset* s : {&d.train, &d.test}) {
    if (s->labels.type() != dtype::u8 || s->labels.rank() != 1 || s->labels.dim(0) != s->images.dim(0))
      broken("labels that do not match the images");
    for (const std::uint8_t l : s->labels.data<std::uint8_t>())
      if (l >= d.classes) broken("a label outside 0..classes-1");
    if (s->images.type() == dtype::f32)
      for (const float v : s->images.data<float>())
        if (!std::isfinite(v)) broken("a feature that is not finite");
  }
  if (d.client_train.defined() &&
      (d.client_train.type() != dtype::u32 || d.client_train.rank() != 1 || d.client_train.dim(0) != x.dim(0)))
    broken("client_train that does not match the training examples");
  if (!std::isfinite(d.mean) || !(d.stddev > 0.0f) || !std::isfinite(d.stddev)) broken("statistics normalize cannot use");
}

// `t` written again as NumPy would write it.
std::vector<std::byte> rewrite(const tensor& t) {
  const char* descr = t.type() == dtype::u8 ? "|u1" : t.type() == dtype::f32 ? "<f4" : "<u4";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < t.rank(); ++i) dict += std::to_string(t.dim(i)) + (t.rank() == 1 || i + 1 < t.rank() ? "," : "");
  dict += "), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::vector<std::byte> out;
  for (const char c : std::string("\x93NUMPY\x01\x00", 8)) out.push_back(static_cast<std::byte>(c));
  out.push_back(static_cast<std::byte>(dict.size() & 0xff));
  out.push_back(static_cast<std::byte>(dict.size() >> 8));
  for (const char c : dict) out.push_back(static_cast<std::byte>(c));
  const std::size_t at = out.size();
  out.resize(at + t.nbytes());
  if (t.nbytes()) std::memcpy(out.data() + at, t.bytes(), t.nbytes());  // a little-endian host
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto bytes = std::as_bytes(std::span(data + 1, size - 1));
  if (data[0] % 2 == 0) {
    labelled_data d;
    try {
      d = detail::load_npz_bytes(bytes, "fuzz.npz");
    } catch (const std::runtime_error& e) {
      check_refusal(e, "load_npz: fuzz.npz");
      return 0;
    }
    check_accepted(d);
    return 0;
  }

  const auto role = static_cast<npy_role>((data[0] / 2) % 3);
  tensor t;
  try {
    t = detail::read_npy_bytes(bytes, role, "a.npy");
  } catch (const std::runtime_error& e) {
    check_refusal(e, "a.npy");
    return 0;
  }
  const dtype want = role == npy_role::labels ? dtype::u8 : role == npy_role::clients ? dtype::u32 : t.type();
  if (t.type() != want || (role == npy_role::features && t.type() != dtype::u8 && t.type() != dtype::f32))
    broken("an array of the wrong dtype for its role");
  if ((role == npy_role::features) != (t.rank() >= 2) || t.rank() > detail::max_image_rank)
    broken("an array of the wrong rank for its role");
  const std::vector<std::byte> again = rewrite(t);
  tensor back;
  try {
    back = detail::read_npy_bytes(again, role, "again.npy");
  } catch (const std::runtime_error& e) {
    broken(std::string("an accepted array is refused once written again: ") + e.what());
  }
  if (back.type() != t.type() || back.shape() != t.shape() ||
      (t.nbytes() && std::memcmp(back.bytes(), t.bytes(), t.nbytes()) != 0))
    broken("an array changed when written again");
  return 0;
}
