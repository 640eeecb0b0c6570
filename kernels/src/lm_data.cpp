// Language-model data (lm.hpp): UTF-8, the character vocabulary and split, the King James Bible
// from the `bible` reader, random windows, and a saved model's directory.

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/lm.hpp"
#include "troupe/kernels/weights.hpp"

namespace troupe::kernels {

std::vector<char32_t> decode_utf8(std::string_view text, const std::string& what) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  const auto bad = [&](std::size_t at, const char* why) {
    throw std::invalid_argument(what + " is not UTF-8 text (binary?): " + why + " at byte " + std::to_string(at));
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0) bad(i, "a NUL byte");
    int extra = 0;
    char32_t cp = 0;
    if (c < 0x80) cp = c;
    else if ((c & 0xE0) == 0xC0) extra = 1, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) extra = 2, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) extra = 3, cp = c & 0x07;
    else bad(i, "an invalid leading byte");
    if (i + static_cast<std::size_t>(extra) >= text.size()) bad(i, "a truncated sequence");
    for (int k = 1; k <= extra; ++k) {
      const auto n = static_cast<unsigned char>(text[i + static_cast<std::size_t>(k)]);
      if ((n & 0xC0) != 0x80) bad(i, "an invalid continuation byte");
      cp = (cp << 6) | (n & 0x3F);
    }
    static constexpr char32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) bad(i, "an invalid code point");
    out.push_back(cp);
    i += static_cast<std::size_t>(extra) + 1;
  }
  return out;
}

std::string encode_utf8(const std::vector<char32_t>& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

text_corpus make_corpus(std::string_view text, const std::string& source) {
  if (text.empty()) throw std::invalid_argument(source + " is empty");
  const auto points = decode_utf8(text, source);
  text_corpus c;
  c.source = source;
  const std::set<char32_t> distinct(points.begin(), points.end());
  c.vocab.assign(distinct.begin(), distinct.end());
  std::vector<std::int32_t> ids(points.size());
  for (std::size_t i = 0; i < points.size(); ++i)
    ids[i] = static_cast<std::int32_t>(std::lower_bound(c.vocab.begin(), c.vocab.end(), points[i]) - c.vocab.begin());
  const auto cut = static_cast<std::ptrdiff_t>(ids.size() * 9 / 10);
  c.train.assign(ids.begin(), ids.begin() + cut);
  c.validation.assign(ids.begin() + cut, ids.end());
  return c;
}

namespace {

std::string read_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw std::invalid_argument(what + ": cannot be read (" + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) throw std::invalid_argument(what + ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(what + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw std::invalid_argument(what + ": cannot be read");
  return s.str();
}

}  // namespace

text_corpus load_text_file(const std::string& path) {
  const std::string what = "--text " + path;
  return make_corpus(read_file(path, what), what);
}

std::string kjv_text() {
  // `bible -f` prints one verse a line, "Ge1:1 In the beginning ...": the whole book from the
  // first verse to the last, then the reference of each line is dropped.
  const char* command = "bible -f gen1:1-rev22:21 </dev/null 2>/dev/null";
  FILE* p = ::popen(command, "r");
  if (!p) throw std::runtime_error("cannot run the bible reader: " + std::string(std::strerror(errno)));
  std::string raw;
  char buf[1 << 16];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) raw.append(buf, n);
  const int status = ::pclose(p);
  if (raw.empty() || status != 0)
    throw std::runtime_error("the King James Bible (--dataset kjv) comes from Debian's bible-kjv and bible-kjv-text "
                             "packages, which seem not installed: apt-get install bible-kjv bible-kjv-text (or run "
                             "cmake/install-deps.sh), or train on a file with --text FILE");
  std::string text;
  text.reserve(raw.size());
  std::size_t start = 0;
  while (start < raw.size()) {
    std::size_t end = raw.find('\n', start);
    if (end == std::string::npos) end = raw.size();
    const std::size_t space = raw.find(' ', start);
    if (space != std::string::npos && space < end) text.append(raw, space + 1, end - space - 1);
    text += '\n';
    start = end + 1;
  }
  return text;
}

void sample_windows(const std::vector<std::int32_t>& tokens, std::int64_t batch, std::int64_t ctx, std::mt19937_64& g,
                    tensor& x, tensor& y) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n < ctx + 1)
    throw std::invalid_argument("a window of ctx + 1 = " + std::to_string(ctx + 1) + " tokens does not fit in " +
                                std::to_string(n) + " tokens");
  if (!x.defined() || x.shape() != tensor::shape_type{batch * ctx, 1}) x = tensor::empty({batch * ctx, 1});
  if (!y.defined() || y.shape() != tensor::shape_type{batch * ctx}) y = tensor::empty({batch * ctx}, dtype::i32);
  auto xd = x.data<float>();
  auto yd = y.data<std::int32_t>();
  const auto starts = static_cast<std::uint64_t>(n - ctx);  // offsets 0 .. n-ctx-1
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto at = static_cast<std::int64_t>(g() % starts);
    for (std::int64_t t = 0; t < ctx; ++t) {
      xd[b * ctx + t] = static_cast<float>(tokens[at + t]);
      yd[b * ctx + t] = tokens[at + t + 1];
    }
  }
}

void save_lm(sequential& model, const std::string& spec, const std::vector<char32_t>& vocab, const std::string& dir) {
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw std::runtime_error("--save " + dir + ": cannot make the directory (" + std::strerror(errno) + ")");
  const auto write = [&](const std::string& name, const std::string& body) {
    const std::string path = dir + "/" + name, tmp = path + ".tmp";
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << body;
    out.close();
    if (!out || std::rename(tmp.c_str(), path.c_str()) != 0)
      throw std::runtime_error("--save " + dir + ": cannot write " + name);
  };
  write("model", spec + "\n");
  write("vocab", encode_utf8(vocab));
  save_weights(model, dir + "/weights.trpw");
}

saved_lm load_lm(const std::string& dir) {
  const auto read = [&](const std::string& name) {
    try {
      return read_file(dir + "/" + name, "--load " + dir + ": " + name);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(std::string(e.what()) + " (a directory that troupe train --save wrote holds model, vocab "
                                                       "and weights.trpw)");
    }
  };
  saved_lm lm;
  lm.spec = read("model");
  while (!lm.spec.empty() && (lm.spec.back() == '\n' || lm.spec.back() == '\r')) lm.spec.pop_back();
  try {
    lm.vocab = decode_utf8(read("vocab"), "--load " + dir + ": vocab");
    if (lm.vocab.empty() || !std::is_sorted(lm.vocab.begin(), lm.vocab.end()) ||
        std::adjacent_find(lm.vocab.begin(), lm.vocab.end()) != lm.vocab.end())
      throw std::invalid_argument("--load " + dir + ": vocab is not a vocabulary (distinct characters in order)");
    lm.model = make_gpt(lm.spec, static_cast<std::int64_t>(lm.vocab.size()));
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  load_weights(*lm.model, dir + "/weights.trpw");
  return lm;
}

}  // namespace troupe::kernels
