// NumPy .npz archives: a zip archive (read with libzip) of .npy arrays (parsed here).
//
// A .npy file is the magic "\x93NUMPY", a major and a minor version byte, the length of the
// header (u16 little-endian in version 1.0, u32 in 2.0 and 3.0), the header, and the data. The
// header is a Python dictionary literal, {'descr': '<f4', 'fortran_order': False, 'shape': (3,
// 4), }, padded with spaces and ended by '\n'. The parser below reads that grammar and no more:
// a header NumPy would not write is refused, never guessed at.
//
// Sizes are checked before anything is allocated: the zip directory's claims against the
// archive's size (a stored entry is as long as its compressed bytes, a deflated one at most
// 1032 times longer), then the header's shape against the entry's size, exactly.

#include "npz.hpp"

#include <zip.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "labelled.hpp"

namespace troupe {
namespace detail {
namespace {

namespace fs = std::filesystem;

// Deflate cannot expand data more than 1032:1 (a 258-byte match coded in 2 bits).
constexpr std::uint64_t max_deflate_ratio = 1032;
constexpr std::string_view npy_magic = "\x93NUMPY";

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

// Printable ASCII only, so that a hostile name or header cannot garble a message or a terminal.
std::string printable(std::string_view s, std::size_t limit = 64) {
  std::string out;
  for (const char c : s.substr(0, limit)) out += c >= 0x20 && c < 0x7f ? c : '?';
  if (s.size() > limit) out += "...";
  return out;
}

// ---- the bytes of one entry -----------------------------------------------------------------

class npy_source {
public:
  virtual ~npy_source() = default;
  // Up to n bytes; fewer only at the end of the entry. Throws on a read error or corruption.
  virtual std::size_t read(std::byte* out, std::size_t n) = 0;
};

class memory_source final : public npy_source {
public:
  explicit memory_source(std::span<const std::byte> bytes) : bytes_(bytes) {}
  std::size_t read(std::byte* out, std::size_t n) override {
    const std::size_t k = std::min(n, bytes_.size());
    if (k) std::memcpy(out, bytes_.data(), k);
    bytes_ = bytes_.subspan(k);
    return k;
  }

private:
  std::span<const std::byte> bytes_;
};

struct zip_file_closer {
  void operator()(zip_file_t* f) const noexcept { zip_fclose(f); }
};

// An entry as libzip inflates it. libzip checks the entry's CRC-32 when it reaches the end,
// which read_npy always asks for (a read past the data).
class zip_entry_source final : public npy_source {
public:
  zip_entry_source(zip_file_t* file, std::string where) : file_(file), where_(std::move(where)) {}
  std::size_t read(std::byte* out, std::size_t n) override {
    std::size_t done = 0;
    while (done < n) {
      const zip_int64_t got = zip_fread(file_.get(), out + done, n - done);
      if (got < 0) {
        const char* why = zip_file_strerror(file_.get());
        fail(where_, std::string("corrupted entry (") + (why ? why : "libzip read error") + ")");
      }
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

private:
  std::unique_ptr<zip_file_t, zip_file_closer> file_;
  std::string where_;
};

// ---- the .npy header ------------------------------------------------------------------------

struct npy_header {
  char kind = 0;               // 'u', 'i' or 'f'
  std::size_t item_size = 0;   // bytes per element
  bool big_endian = false;
  std::string descr;           // as written, for messages
  tensor::shape_type shape;
};

const char* role_dtypes(npy_role role) {
  return role == npy_role::features
             ? "x arrays must be uint8 ('|u1', pixels 0..255) or float32 ('<f4' or '>f4'): convert "
               "with x.astype(np.uint8) or x.astype(np.float32)"
             : "it must hold integers ('|u1', '|i1', '<i2', '<u2', '<i4', '<u4', '<i8' or '<u8', or "
               "the '>' forms): convert with y.astype(np.int64)";
}

// Reads the descr string against what `role` accepts.
void parse_descr(npy_header& h, const std::string& descr, npy_role role, const std::string& where) {
  h.descr = descr;
  const std::string shown = "'" + printable(descr) + "'";
  if (descr.find('O') != std::string::npos)
    fail(where, "dtype " + shown + " is an object array (pickled Python objects): not supported; " +
                    role_dtypes(role));
  if (descr.size() != 3 || (descr[0] != '<' && descr[0] != '>' && descr[0] != '|') ||
      (descr[1] != 'u' && descr[1] != 'i' && descr[1] != 'f') || descr[2] < '1' || descr[2] > '8')
    fail(where, "dtype " + shown + " is not supported: " + role_dtypes(role));
  h.kind = descr[1];
  h.item_size = static_cast<std::size_t>(descr[2] - '0');
  h.big_endian = descr[0] == '>';
  const bool one_byte = h.item_size == 1;
  const bool known_size = h.item_size == 1 || h.item_size == 2 || h.item_size == 4 || h.item_size == 8;
  // '|' (no byte order) only for one-byte types, as NumPy writes them; '<' and '>' there too,
  // as other writers do.
  const bool order_ok = descr[0] != '|' || one_byte;
  bool ok = false;
  if (role == npy_role::features)
    ok = (h.kind == 'u' && one_byte) || (h.kind == 'f' && h.item_size == 4 && descr[0] != '|');
  else
    ok = h.kind != 'f' && known_size && order_ok;
  if (!ok) fail(where, "dtype " + shown + " is not supported: " + role_dtypes(role));
}

// A recursive-descent reader of the header dictionary.
class header_parser {
public:
  header_parser(std::string_view text, npy_role role, const std::string& where)
      : text_(text), role_(role), where_(where) {}

  npy_header parse() {
    // The dictionary, then spaces, then the '\n' that ends every header NumPy writes.
    if (text_.empty() || text_.back() != '\n') bad("the header does not end with '\\n'");
    text_.remove_suffix(1);
    npy_header h;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    skip_spaces();
    expect('{');
    skip_spaces();
    while (peek() != '}') {
      const std::string key = parse_string();
      skip_spaces();
      expect(':');
      skip_spaces();
      if (key == "descr") {
        if (seen_descr) bad("the key 'descr' appears twice");
        seen_descr = true;
        if (peek() == '[')
          fail(where_, "dtype is a list of fields (a structured array): not supported; " +
                           std::string(role_dtypes(role_)));
        parse_descr(h, parse_string(), role_, where_);
      } else if (key == "fortran_order") {
        if (seen_order) bad("the key 'fortran_order' appears twice");
        seen_order = true;
        if (parse_bool())
          fail(where_, "fortran_order is True (column-major data): save np.ascontiguousarray(x) instead");
      } else if (key == "shape") {
        if (seen_shape) bad("the key 'shape' appears twice");
        seen_shape = true;
        h.shape = parse_shape();
      } else {
        bad("unknown key '" + printable(key) + "' (a .npy header holds 'descr', 'fortran_order' and 'shape')");
      }
      skip_spaces();
      if (peek() == ',') {
        ++at_;
        skip_spaces();
      } else if (peek() != '}') {
        bad("expected ',' or '}' at byte " + std::to_string(at_));
      }
    }
    ++at_;
    skip_spaces();
    if (at_ != text_.size()) bad("unexpected text after the dictionary at byte " + std::to_string(at_));
    if (!seen_descr || !seen_order || !seen_shape)
      bad(std::string("the key '") + (!seen_descr ? "descr" : !seen_order ? "fortran_order" : "shape") +
          "' is missing");
    return h;
  }

private:
  [[noreturn]] void bad(const std::string& what) const { fail(where_, "malformed .npy header: " + what); }

  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skip_spaces() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t')) ++at_;
  }
  void expect(char c) {
    if (peek() != c)
      bad(std::string("expected '") + c + "' at byte " + std::to_string(at_));
    ++at_;
  }
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') bad("expected a quoted string at byte " + std::to_string(at_));
    const std::size_t begin = ++at_;
    while (at_ < text_.size() && text_[at_] != quote) {
      if (text_[at_] == '\\' || static_cast<unsigned char>(text_[at_]) < 0x20 ||
          static_cast<unsigned char>(text_[at_]) >= 0x7f)
        bad("unexpected character in a string at byte " + std::to_string(at_));
      ++at_;
    }
    if (at_ >= text_.size()) bad("a string is not closed");
    return std::string(text_.substr(begin, at_++ - begin));
  }
  bool parse_bool() {
    for (const auto& [word, value] : {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}})
      if (text_.substr(at_, word.size()) == word) {
        at_ += word.size();
        return value;
      }
    bad("fortran_order must be True or False (at byte " + std::to_string(at_) + ")");
  }
  std::int64_t parse_dimension() {
    if (peek() == '-') fail(where_, "the shape has a negative dimension");
    if (peek() < '0' || peek() > '9') bad("expected a dimension at byte " + std::to_string(at_));
    if (peek() == '0' && at_ + 1 < text_.size() && text_[at_ + 1] >= '0' && text_[at_ + 1] <= '9')
      bad("a dimension has a leading zero at byte " + std::to_string(at_));
    std::int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (value > (std::numeric_limits<std::int64_t>::max() - digit) / 10)
        fail(where_, "a dimension of the shape does not fit in 64 bits");
      value = value * 10 + digit;
      ++at_;
    }
    return value;
  }
  tensor::shape_type parse_shape() {
    expect('(');
    skip_spaces();
    tensor::shape_type shape;
    bool trailing_comma = false;
    while (peek() != ')') {
      if (shape.size() >= 64) fail(where_, "the shape has more than 64 dimensions");
      shape.push_back(parse_dimension());
      skip_spaces();
      trailing_comma = false;
      if (peek() == ',') {
        ++at_;
        trailing_comma = true;
        skip_spaces();
      } else if (peek() != ')') {
        bad("expected ',' or ')' in the shape at byte " + std::to_string(at_));
      }
    }
    ++at_;
    // Python reads (5) as the number 5: a one-dimensional shape is written (5,).
    if (shape.size() == 1 && !trailing_comma) bad("the shape (" + std::to_string(shape[0]) + ") is no tuple");
    return shape;
  }

  std::string_view text_;
  std::size_t at_ = 0;
  npy_role role_;
  const std::string& where_;
};

// Reads "\x93NUMPY", the version and the header length, then the header; returns the header
// and (in `used`) the bytes read so far.
npy_header read_header(npy_source& in, std::uint64_t entry_size, npy_role role, const std::string& where,
                       std::uint64_t& used) {
  std::array<std::byte, 12> prefix{};
  const std::size_t got = in.read(prefix.data(), 10);
  const auto* p = reinterpret_cast<const unsigned char*>(prefix.data());
  if (got < 6 || std::memcmp(p, npy_magic.data(), 6) != 0)
    fail(where, got < 6 && std::memcmp(p, npy_magic.data(), got) == 0
                    ? "truncated: " + std::to_string(got) + " bytes are too short for a .npy header"
                    : "not a .npy array (it does not start with \\x93NUMPY)");
  if (got < 10) fail(where, "truncated: " + std::to_string(got) + " bytes are too short for a .npy header");
  const unsigned major = p[6], minor = p[7];
  if ((major < 1 || major > 3) || minor != 0)
    fail(where, ".npy version " + std::to_string(major) + "." + std::to_string(minor) +
                    " is not one this reader knows (1.0, 2.0, 3.0)");
  std::uint64_t header_size = p[8] | std::uint64_t{p[9]} << 8;
  used = 10;
  if (major >= 2) {
    if (in.read(prefix.data() + 10, 2) < 2) fail(where, "truncated: the .npy header length is cut short");
    header_size |= std::uint64_t{p[10]} << 16 | std::uint64_t{p[11]} << 24;
    used = 12;
  }
  if (used > entry_size)
    fail(where, "the entry holds more than the " + std::to_string(entry_size) + " bytes its zip directory entry claims");
  if (header_size > entry_size - used)
    fail(where, "the .npy header announces " + std::to_string(header_size) + " bytes but the entry holds only " +
                    std::to_string(entry_size - used) + " after its first " + std::to_string(used) +
                    " (truncated, or a header that lies about its size)");
  if (header_size > max_npy_header)
    fail(where, "the .npy header announces " + std::to_string(header_size) + " bytes, more than the " +
                    std::to_string(max_npy_header) + " this reader accepts");
  std::string text(static_cast<std::size_t>(header_size), '\0');
  if (in.read(reinterpret_cast<std::byte*>(text.data()), text.size()) < text.size())
    fail(where, "truncated: the entry ends inside the .npy header");
  used += header_size;
  return header_parser(text, role, where).parse();
}

template <class T>
T load_as(const std::byte* p, bool big_endian) {
  std::array<std::byte, sizeof(T)> b;
  std::memcpy(b.data(), p, sizeof(T));
  if (big_endian != (std::endian::native == std::endian::big)) std::reverse(b.begin(), b.end());
  return std::bit_cast<T>(b);
}

// The integer at p, as a 64-bit signed value, or nothing for a uint64 ('<u8') above 2^63 - 1.
std::optional<std::int64_t> integer_at(const std::byte* p, const npy_header& h) {
  const bool be = h.big_endian;
  const bool s = h.kind == 'i';
  switch (h.item_size) {
    case 1: return s ? std::int64_t{load_as<std::int8_t>(p, be)} : std::int64_t{load_as<std::uint8_t>(p, be)};
    case 2: return s ? std::int64_t{load_as<std::int16_t>(p, be)} : std::int64_t{load_as<std::uint16_t>(p, be)};
    case 4: return s ? std::int64_t{load_as<std::int32_t>(p, be)} : std::int64_t{load_as<std::uint32_t>(p, be)};
    default: {
      if (s) return load_as<std::int64_t>(p, be);
      const std::uint64_t v = load_as<std::uint64_t>(p, be);
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
      return static_cast<std::int64_t>(v);
    }
  }
}

std::string shape_text(const tensor::shape_type& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

tensor read_npy(npy_source& in, std::uint64_t entry_size, npy_role role, const std::string& where) {
  std::uint64_t used = 0;
  const npy_header h = read_header(in, entry_size, role, where, used);

  const int rank = static_cast<int>(h.shape.size());
  if (role == npy_role::features && (rank < 2 || rank > max_image_rank))
    fail(where, "shape " + shape_text(h.shape) + " has rank " + std::to_string(rank) + ": x needs (N, ...) of rank 2 to " +
                    std::to_string(max_image_rank) + " (N examples; reshape a vector of features with x[:, None])");
  if (role != npy_role::features && rank != 1)
    fail(where, "shape " + shape_text(h.shape) + " has rank " + std::to_string(rank) + ": it must be 1-D (N,)");

  // Every product is checked: the dimensions must describe a tensor even when one of them is
  // zero, and the elements must fit in the bytes that follow the header.
  const std::uint64_t available = entry_size - used;
  const std::uint64_t max_elements = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / 8;
  std::uint64_t nonzero = 1;
  bool empty = false;
  for (const std::int64_t d : h.shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (nonzero > max_elements / static_cast<std::uint64_t>(d))
      fail(where, "shape " + shape_text(h.shape) + " is no tensor's (too many elements)");
    nonzero *= static_cast<std::uint64_t>(d);
  }
  const std::uint64_t elements = empty ? 0 : nonzero;  // at most 2^60: times 8 bytes cannot wrap
  if (elements > available / h.item_size)
    fail(where, "truncated: shape " + shape_text(h.shape) + " of '" + h.descr + "' needs " +
                    std::to_string(elements * h.item_size) + " bytes of data, the entry holds " +
                    std::to_string(available) + " after its header");
  const std::uint64_t data_bytes = elements * h.item_size;
  if (data_bytes < available)
    fail(where, std::to_string(available - data_bytes) + " trailing bytes after the " + std::to_string(data_bytes) +
                    " bytes of data that shape " + shape_text(h.shape) + " of '" + h.descr + "' announces");

  const auto read_all = [&](std::byte* out) {
    const std::size_t got = data_bytes ? in.read(out, static_cast<std::size_t>(data_bytes)) : 0;
    if (got < data_bytes)
      fail(where, "truncated: the data ends after " + std::to_string(got) + " of " + std::to_string(data_bytes) + " bytes");
    // A read past the data drives libzip to the entry's end, where it checks the CRC.
    std::byte extra{};
    if (in.read(&extra, 1) != 0) fail(where, "trailing bytes: the entry goes on after its data");
  };

  if (role == npy_role::features) {
    tensor out = tensor::empty(h.shape, h.kind == 'u' ? dtype::u8 : dtype::f32);
    read_all(out.bytes());
    if (h.kind == 'f' && h.big_endian != (std::endian::native == std::endian::big)) {
      std::byte* p = out.bytes();
      for (std::uint64_t i = 0; i < data_bytes; i += 4) {
        std::swap(p[i], p[i + 3]);
        std::swap(p[i + 1], p[i + 2]);
      }
    }
    return out;
  }
  std::vector<std::byte> raw(static_cast<std::size_t>(data_bytes));
  read_all(raw.data());
  const bool labels = role == npy_role::labels;
  const std::int64_t top = labels ? 255 : std::int64_t{std::numeric_limits<std::uint32_t>::max()};
  tensor out = tensor::empty({h.shape[0]}, labels ? dtype::u8 : dtype::u32);
  for (std::size_t i = 0; i < static_cast<std::size_t>(elements); ++i) {
    const std::optional<std::int64_t> v = integer_at(raw.data() + i * h.item_size, h);
    if (!v || *v < 0 || *v > top) {
      const std::string value = v ? std::to_string(*v) : std::to_string(load_as<std::uint64_t>(raw.data() + i * h.item_size, h.big_endian));
      fail(where, std::string(labels ? "label " : "client index ") + value + " at index " + std::to_string(i) +
                      " is outside 0.." + std::to_string(top) +
                      (labels ? " (classes are numbered 0, 1, 2, ...)" : " (clients are numbered 0, 1, 2, ...)"));
    }
    if (labels) out.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(*v);
    else out.data<std::uint32_t>()[i] = static_cast<std::uint32_t>(*v);
  }
  return out;
}

// ---- the archive ----------------------------------------------------------------------------

struct zip_discarder {
  void operator()(zip_t* z) const noexcept { zip_discard(z); }
};
using zip_ptr = std::unique_ptr<zip_t, zip_discarder>;

std::string zip_error_text(int code) {
  zip_error_t e;
  zip_error_init_with_code(&e, code);
  std::string out = zip_error_strerror(&e);
  zip_error_fini(&e);
  return out;
}

[[noreturn]] void fail_open(const std::string& where, int code) {
  if (code == ZIP_ER_NOZIP)
    fail(where, "not a zip archive (an .npz is one: write it with np.savez or np.savez_compressed)");
  fail(where, "not a readable zip archive (" + zip_error_text(code) + ")");
}

// A .npy where an .npz is expected is a common slip: say so.
void check_not_npy(std::span<const std::byte> head, const std::string& where) {
  if (head.size() >= npy_magic.size() && std::memcmp(head.data(), npy_magic.data(), npy_magic.size()) == 0)
    fail(where, "is a single .npy array, not an .npz archive: save with np.savez(path, x_train=..., "
                "y_train=..., x_test=..., y_test=...)");
}

std::string entry_list(zip_t* z) {
  const zip_int64_t n = zip_get_num_entries(z, 0);
  if (n <= 0) return "it holds no entries";
  std::string out = "it holds ";
  for (zip_int64_t i = 0; i < std::min<zip_int64_t>(n, 12); ++i) {
    const char* name = zip_get_name(z, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
    out += (i ? ", " : "") + printable(name ? name : "?");
  }
  return out + (n > 12 ? ", ... (" + std::to_string(n) + " entries)" : "");
}

// The array `name` + ".npy", or nothing when it is absent and `optional`.
std::optional<tensor> read_entry(zip_t* z, std::uint64_t archive_size, const std::string& path,
                                 const std::string& name, npy_role role, bool optional) {
  const std::string entry = name + ".npy";
  const std::string where = "load_npz: " + path + ": " + entry;
  const zip_int64_t index = zip_name_locate(z, entry.c_str(), ZIP_FL_ENC_RAW);
  if (index < 0) {
    if (optional) return std::nullopt;
    fail("load_npz: " + path, "the array " + name + " is missing (no entry " + entry + "; " +
                                                   entry_list(z) + ")");
  }
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(z, static_cast<zip_uint64_t>(index), 0, &st) != 0)
    fail(where, std::string("cannot read its zip directory entry (") + zip_strerror(z) + ")");
  const zip_uint64_t need = ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD | ZIP_STAT_ENCRYPTION_METHOD;
  if ((st.valid & need) != need) fail(where, "its zip directory entry lacks sizes or methods");
  if (st.encryption_method != ZIP_EM_NONE) fail(where, "the entry is encrypted: not supported");
  if (st.comp_size > archive_size)
    fail(where, "the zip directory claims " + std::to_string(st.comp_size) + " compressed bytes in an archive of " +
                    std::to_string(archive_size));
  if (st.comp_method == ZIP_CM_STORE) {
    if (st.size != st.comp_size)
      fail(where, "a stored entry of " + std::to_string(st.comp_size) + " bytes claims " + std::to_string(st.size) +
                      " bytes of data: the zip directory is corrupted");
  } else if (st.comp_method == ZIP_CM_DEFLATE) {
    if (st.size / max_deflate_ratio > st.comp_size)
      fail(where, "a deflated entry of " + std::to_string(st.comp_size) + " bytes claims " + std::to_string(st.size) +
                      " bytes of data, more than deflate can hold: the zip directory is corrupted");
  } else {
    fail(where, "compression method " + std::to_string(st.comp_method) +
                    " is not supported (np.savez stores entries, np.savez_compressed deflates them)");
  }
  zip_file_t* file = zip_fopen_index(z, static_cast<zip_uint64_t>(index), 0);
  if (!file) fail(where, std::string("cannot open the entry (") + zip_strerror(z) + ")");
  zip_entry_source in(file, where);
  return read_npy(in, st.size, role, where);
}

labelled_data load_archive(zip_t* z, std::uint64_t archive_size, const std::string& path) {
  labelled_data out;
  out.train.images = *read_entry(z, archive_size, path, "x_train", npy_role::features, false);
  out.train.labels = *read_entry(z, archive_size, path, "y_train", npy_role::labels, false);
  out.test.images = *read_entry(z, archive_size, path, "x_test", npy_role::features, false);
  out.test.labels = *read_entry(z, archive_size, path, "y_test", npy_role::labels, false);
  if (auto c = read_entry(z, archive_size, path, "client_train", npy_role::clients, true))
    out.client_train = std::move(*c);
  finish_labelled_data(out, "load_npz: " + path + ": ",
                       {"x_train.npy", "y_train.npy", "x_test.npy", "y_test.npy", "client_train.npy"});
  return out;
}

}  // namespace

tensor read_npy_bytes(std::span<const std::byte> bytes, npy_role role, const std::string& where) {
  memory_source in(bytes);
  return read_npy(in, bytes.size(), role, where);
}

labelled_data load_npz_bytes(std::span<const std::byte> archive, const std::string& name) {
  const std::string where = "load_npz: " + name;
  check_not_npy(archive, where);
  // libzip opens an empty buffer as an archive with no entries.
  if (archive.empty()) fail(where, "is empty: not a zip archive (an .npz is one)");
  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* source = zip_source_buffer_create(archive.data(), archive.size(), 0, &error);
  if (!source) {
    const int code = zip_error_code_zip(&error);
    zip_error_fini(&error);
    fail_open(where, code);
  }
  zip_ptr z(zip_open_from_source(source, ZIP_RDONLY | ZIP_CHECKCONS, &error));
  if (!z) {
    zip_source_free(source);  // the archive takes the source only when it opens
    const int code = zip_error_code_zip(&error);
    zip_error_fini(&error);
    fail_open(where, code);
  }
  zip_error_fini(&error);
  return load_archive(z.get(), archive.size(), name);
}

}  // namespace detail

labelled_data load_npz(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string where = "load_npz: " + path;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) detail::fail(where, "the file is missing");
  if (status.type() == fs::file_type::directory)
    detail::fail(where, "is a directory, not an .npz file (load_idx_dir reads a directory of IDX files)");
  if (status.type() != fs::file_type::regular) detail::fail(where, "is not a regular file, not an .npz file");
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) detail::fail(where, "cannot determine its size: " + ec.message());
  if (size == 0) detail::fail(where, "is empty: not a zip archive (an .npz is one)");

  std::array<std::byte, 6> head{};
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    const std::size_t got = std::fread(head.data(), 1, head.size(), f);
    std::fclose(f);
    detail::check_not_npy(std::span(head.data(), got), where);
  }
  int code = 0;
  detail::zip_ptr z(zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code));
  if (!z) detail::fail_open(where, code);
  return detail::load_archive(z.get(), size, path);
}

}  // namespace troupe
