#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/render.hpp>
#include <troupe/pipeline/schedule.hpp>
#include <troupe/pipeline/simulator.hpp>

namespace {

using namespace troupe::pipeline;

std::string draw(const schedule& s, render_format f, render_options o = {},
                 const cost_model& costs = {}) {
  return render(s, simulate(s, costs), f, o);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

std::size_t compute_actions(const schedule& s) {
  std::size_t n = 0;
  for (const auto& row : s.ranks)
    for (const auto& a : row)
      if (a && is_compute(a->kind)) ++n;
  return n;
}

// ---- a small JSON reader: enough to prove the trace parses and to read it back -------------

struct json {
  enum class type { null, boolean, number, string, array, object } kind = type::null;
  double number = 0;
  std::string text;
  std::vector<json> items;
  std::map<std::string, json> fields;

  const json& at(const std::string& key) const {
    auto it = fields.find(key);
    if (it == fields.end()) throw std::runtime_error("no field " + key);
    return it->second;
  }
};

class json_reader {
public:
  explicit json_reader(const std::string& text) : t_(text) {}

  json read_document() {
    json v = value();
    space();
    if (i_ != t_.size()) fail("text after the document");
    return v;
  }

private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("JSON: " + why + " at offset " + std::to_string(i_));
  }
  void space() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  void expect(char c) {
    space();
    if (i_ >= t_.size() || t_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  bool next_is(char c) {
    space();
    return i_ < t_.size() && t_[i_] == c;
  }
  std::string string_literal() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= t_.size()) fail("unterminated string");
      const char c = t_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= t_.size()) fail("unterminated escape");
      const char e = t_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u':
          if (i_ + 4 > t_.size()) fail("short \\u escape");
          out += static_cast<char>(std::stoi(t_.substr(i_, 4), nullptr, 16));
          i_ += 4;
          break;
        default: fail("bad escape");
      }
    }
  }
  json value() {
    space();
    if (i_ >= t_.size()) fail("unexpected end");
    json v;
    const char c = t_[i_];
    if (c == '{') {
      v.kind = json::type::object;
      ++i_;
      if (next_is('}')) return ++i_, v;
      do {
        std::string key = string_literal();
        expect(':');
        if (!v.fields.emplace(key, value()).second) fail("duplicate key " + key);
      } while (next_is(',') && ++i_);
      expect('}');
    } else if (c == '[') {
      v.kind = json::type::array;
      ++i_;
      if (next_is(']')) return ++i_, v;
      do v.items.push_back(value());
      while (next_is(',') && ++i_);
      expect(']');
    } else if (c == '"') {
      v.kind = json::type::string;
      v.text = string_literal();
    } else if (t_.compare(i_, 4, "true") == 0 || t_.compare(i_, 4, "null") == 0) {
      v.kind = c == 't' ? json::type::boolean : json::type::null;
      i_ += 4;
    } else if (t_.compare(i_, 5, "false") == 0) {
      v.kind = json::type::boolean;
      i_ += 5;
    } else {
      const std::size_t start = i_;
      if (t_[i_] == '-') ++i_;
      if (i_ >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[i_]))) fail("bad value");
      if (t_[i_] == '0' && i_ + 1 < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_ + 1])))
        fail("leading zero");
      while (i_ < t_.size() && (std::isdigit(static_cast<unsigned char>(t_[i_])) || t_[i_] == '.' ||
                                t_[i_] == 'e' || t_[i_] == 'E' || t_[i_] == '+' || t_[i_] == '-'))
        ++i_;
      v.kind = json::type::number;
      char* end = nullptr;
      const std::string digits = t_.substr(start, i_ - start);
      v.number = std::strtod(digits.c_str(), &end);
      if (end != digits.c_str() + digits.size()) fail("bad number " + digits);
    }
    return v;
  }

  const std::string& t_;
  std::size_t i_ = 0;
};

// ---- a small XML checker: balanced tags, quoted attributes, escaped text --------------------

struct xml_summary {
  std::string root;            // the root element's start tag, attributes included
  int elements = 0;
};

xml_summary check_xml(const std::string& t) {
  xml_summary out;
  std::vector<std::string> open;
  bool root_closed = false;
  auto check_entities = [](const std::string& text) {
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '<') throw std::runtime_error("raw '<' in text or attribute");
      if (text[i] != '&') continue;
      const auto semi = text.find(';', i);
      const std::string entity = semi == std::string::npos ? "" : text.substr(i, semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" &&
          entity != "&apos;" && entity != "&#39;")
        throw std::runtime_error("raw '&' or unknown entity near: " + text.substr(i, 12));
    }
  };
  std::size_t i = 0;
  while (i < t.size()) {
    const auto lt = t.find('<', i);
    check_entities(t.substr(i, lt == std::string::npos ? std::string::npos : lt - i));
    if (lt == std::string::npos) break;
    if (t.compare(lt, 2, "<?") == 0) {
      if (lt != 0) throw std::runtime_error("XML declaration not at the start");
      i = t.find("?>", lt) + 2;
      continue;
    }
    if (t.compare(lt, 2, "</") == 0) {
      const auto gt = t.find('>', lt);
      const std::string name = t.substr(lt + 2, gt - lt - 2);
      if (open.empty() || open.back() != name) throw std::runtime_error("unbalanced </" + name + ">");
      open.pop_back();
      if (open.empty()) root_closed = true;
      i = gt + 1;
      continue;
    }
    // A start tag: the name, then attributes with quoted values, up to > or />.
    std::size_t j = lt + 1;
    while (j < t.size() && (std::isalnum(static_cast<unsigned char>(t[j])) || t[j] == '-' || t[j] == ':')) ++j;
    const std::string name = t.substr(lt + 1, j - lt - 1);
    if (name.empty()) throw std::runtime_error("tag without a name");
    if (open.empty() && (root_closed || out.elements > 0)) throw std::runtime_error("a second root");
    bool self_closing = false;
    while (true) {
      while (j < t.size() && std::isspace(static_cast<unsigned char>(t[j]))) ++j;
      if (j >= t.size()) throw std::runtime_error("unterminated tag " + name);
      if (t[j] == '>') break;
      if (t.compare(j, 2, "/>") == 0) {
        self_closing = true;
        ++j;
        break;
      }
      const auto eq = t.find('=', j);
      if (eq == std::string::npos || t[eq + 1] != '"') throw std::runtime_error("unquoted attribute in " + name);
      const auto close = t.find('"', eq + 2);
      check_entities(t.substr(eq + 2, close - eq - 2));
      j = close + 1;
    }
    if (open.empty()) out.root = t.substr(lt, j + 1 - lt);
    ++out.elements;
    if (!self_closing) open.push_back(name);
    else if (open.empty()) root_closed = true;
    i = j + 1;
  }
  if (!open.empty()) throw std::runtime_error("unclosed <" + open.back() + ">");
  if (!root_closed) throw std::runtime_error("no root element");
  return out;
}

// ---- ascii ----------------------------------------------------------------------------------

// Unit costs: F = 1, B = 2 per rank's whole shard (I = W = 1), no communication.
TEST(RenderAscii, DrawsGPipeOnTheExactGridOfItsShortestAction) {
  EXPECT_EQ(draw(generate("gpipe", 2, 2), render_format::ascii),
            "gpipe: p=2 m=2 v=1, makespan 9, bubble 33.33%, bubble_span 33.33%\n"
            "one cell = 1 time unit\n"
            "rank 0 |F0F1......B0  B1  |\n"
            "rank 1 |..F0F1B0  B1  ....|\n"
            "legend: F forward, B backward, . idle\n");
}

TEST(RenderAscii, Draws1F1BWithEachBackwardTwoCellsWide) {
  EXPECT_EQ(draw(generate("1f1b", 2, 3), render_format::ascii),
            "1f1b: p=2 m=3 v=1, makespan 12, bubble 25.00%, bubble_span 25.00%\n"
            "one cell = 1 time unit\n"
            "rank 0 |F0F1....B0  F2B1  ..B2  |\n"
            "rank 1 |..F0B0  F1B1  F2B2  ....|\n"
            "legend: F forward, B backward, . idle\n");
}

TEST(RenderAscii, CellIsTheGreatestRationalDividingEveryTime) {
  // F = 1/2 and B = 3/4: every time is a multiple of 1/4, so F takes 2 cells and B 3.
  EXPECT_EQ(draw(generate("gpipe", 1, 1), render_format::ascii, {},
                 cost_model::parse("F=1/2,B=3/4")),
            "gpipe: p=1 m=1 v=1, makespan 5/4, bubble 0.00%, bubble_span 0.00%\n"
            "one cell = 1/4 time unit\n"
            "rank 0 |F0  B0    |\n"
            "legend: F forward, B backward, . idle\n");
  // F = 2 and B = 4: the grid is 2, not 1.
  const auto wide = lines_of(draw(generate("gpipe", 1, 2), render_format::ascii, {},
                                  cost_model::parse("F=2,B=4")));
  EXPECT_EQ(wide[1], "one cell = 2 time units");
  EXPECT_EQ(wide[2], "rank 0 |F0F1B0  B1  |");
}

TEST(RenderAscii, CellsWidenToTheLongestMicrobatchLabel) {
  const auto lines = lines_of(draw(generate("gpipe", 1, 11), render_format::ascii));
  EXPECT_EQ(lines[2].substr(0, 17), "rank 0 |F0 F1 F2 ");
  EXPECT_NE(lines[2].find("F10B0    B1    "), std::string::npos) << lines[2];
}

TEST(RenderAscii, ScalesDownWideTimelinesAndSaysSo) {
  const auto s = generate("1f1b", 4, 64);
  const auto exact = lines_of(draw(s, render_format::ascii, {.color = false, .max_columns = 10000}));
  EXPECT_EQ(exact[1], "one cell = 1 time unit");
  EXPECT_EQ(exact[2].size(), std::string("rank 0 |").size() + 201 * 3 + 1);

  const auto lines = lines_of(draw(s, render_format::ascii));
  EXPECT_NE(lines[1].find("one cell = 2 time units (scaled down to fit 400 columns"),
            std::string::npos)
      << lines[1];
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(lines[2 + r].rfind("rank " + std::to_string(r) + " |", 0), 0u);
    EXPECT_LE(lines[2 + r].size(), std::string("rank 0 |").size() + 400 + 1);
  }
}

TEST(RenderAscii, DrawsEachComputeActionOnceAndNoSendsOrReceives) {
  const auto s = generate("zb-h1", 3, 5);
  const auto text = draw(s, render_format::ascii);
  EXPECT_EQ(draw(lower(s), render_format::ascii), text);
  std::size_t labels = 0;
  for (const auto& line : lines_of(text))
    if (line.rfind("rank ", 0) == 0)
      for (char c : line.substr(line.find('|')))
        if (c == 'F' || c == 'I' || c == 'W') ++labels;
  EXPECT_EQ(labels, compute_actions(s));
}

TEST(RenderAscii, UsesColourCodesOnlyWhenAsked) {
  const auto s = generate("zb-h1", 2, 3);
  const auto plain = draw(s, render_format::ascii);
  EXPECT_EQ(plain.find('\x1b'), std::string::npos);
  const auto coloured = draw(s, render_format::ascii, {.color = true});
  EXPECT_NE(coloured.find("\x1b[97;44mF0"), std::string::npos);  // forward: blue
  EXPECT_NE(coloured.find("\x1b[30;42mI0"), std::string::npos);  // inputs: green
  EXPECT_NE(coloured.find("\x1b[30;43mW0"), std::string::npos);  // weights: yellow
  for (const auto& line : lines_of(coloured)) {
    if (line.find('\x1b') == std::string::npos) continue;
    // Every colour is reset before the line ends.
    EXPECT_EQ(line.rfind('\x1b'), line.rfind("\x1b[0m")) << line;
    EXPECT_EQ(count(line, "\x1b[0m"), count(line, "\x1b[") - count(line, "\x1b[0m")) << line;
  }
  // Without the colour codes the picture is the plain one.
  std::string stripped;
  for (std::size_t i = 0; i < coloured.size(); ++i) {
    if (coloured[i] == '\x1b') {
      i = coloured.find('m', i);
      continue;
    }
    stripped += coloured[i];
  }
  EXPECT_EQ(stripped, plain);
}

TEST(RenderAscii, TellsTheTwoChunksOfZbVApart) {
  const auto s = generate("zb-v", 4, 8);
  const auto text = draw(s, render_format::ascii);
  const auto lines = lines_of(text);
  // Rank 0 holds stages 0 (chunk 0, upper case) and 7 (chunk 1, lower case).
  EXPECT_EQ(lines[2].rfind("rank 0 |F0F1", 0), 0u) << lines[2];
  for (const char* label : {"F7", "f7", "I7", "i7", "W7", "w7"})
    EXPECT_NE(lines[2].find(label), std::string::npos) << label << " in " << lines[2];
  EXPECT_NE(lines.back().find("lower case: the rank's second stage (chunk 1)"), std::string::npos)
      << lines.back();
  const auto coloured = draw(s, render_format::ascii, {.color = true});
  EXPECT_NE(coloured.find("\x1b[97;44mF"), std::string::npos);
  EXPECT_NE(coloured.find("\x1b[30;104mf"), std::string::npos);  // a lighter blue for chunk 1
  // One-stage schedules say nothing about chunks.
  EXPECT_EQ(draw(generate("1f1b", 2, 2), render_format::ascii).find("chunk"), std::string::npos);
}

// ---- csv ------------------------------------------------------------------------------------

TEST(RenderCsv, IsPyTorchsCsvFormat) {
  for (const auto& name : schedule_names()) {
    const auto s = generate(name, 4, 8);
    EXPECT_EQ(draw(s, render_format::csv), to_csv(s)) << name;
    EXPECT_EQ(draw(lower(s), render_format::csv), to_csv(lower(s))) << name;
  }
}

// ---- svg ------------------------------------------------------------------------------------

TEST(RenderSvg, IsAStandaloneDocumentWithOneBoxPerComputeAction) {
  for (const auto& name : schedule_names()) {
    const auto s = lower(generate(name, 3, 6));
    const auto svg = draw(s, render_format::svg, {}, cost_model::parse("F=1,B=2,I=1,W=1,comm=1/4"));
    xml_summary doc;
    ASSERT_NO_THROW(doc = check_xml(svg)) << name;
    EXPECT_EQ(doc.root.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u) << doc.root;
    for (const char* attribute : {" width=\"", " height=\"", " viewBox=\"0 0 "})
      EXPECT_NE(doc.root.find(attribute), std::string::npos) << attribute;
    EXPECT_EQ(count(svg, "<svg"), 1u);
    EXPECT_EQ(count(svg, "class=\"box "), compute_actions(s)) << name;
    EXPECT_EQ(count(svg, "SEND_"), 0u) << name;
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(count(svg, ">rank " + std::to_string(r) + "</text>"), 1u) << name;
  }
}

TEST(RenderSvg, PlacesBoxesAtTheirSimulatedTimes) {
  // gpipe p=1 m=2, unit costs: F0 [0,1], F1 [1,2], B0 [2,4], B1 [4,6]; the shortest action is
  // 28 pixels unless that makes the plot narrower than 480, so one time unit is 80 pixels.
  const auto svg = draw(generate("gpipe", 1, 2), render_format::svg);
  EXPECT_NE(svg.find("<rect class=\"box F\" x=\"160\" y=\"63\" width=\"80\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("<rect class=\"box B\" x=\"400\" y=\"63\" width=\"160\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("<title>0B1: 4 to 6</title>"), std::string::npos);
  EXPECT_NE(svg.find("text-anchor=\"middle\">1</text>"), std::string::npos);
  EXPECT_NE(svg.find("bubble 0.00%"), std::string::npos);
}

TEST(RenderSvg, EscapesTheTitle) {
  auto s = generate("gpipe", 2, 2);
  s.name = "a<b & \"c\">";
  const auto svg = draw(s, render_format::svg);
  EXPECT_NO_THROW(check_xml(svg));
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;&gt;: p=2 m=2 v=1"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
}

TEST(RenderSvg, ShadesTheChunksOfZbVDifferently) {
  const auto svg = draw(generate("zb-v", 2, 3), render_format::svg);
  // Rank 0's first forward is stage 0 (chunk 0); stage 3 (chunk 1) is darker.
  EXPECT_NE(svg.find("<title>0F0:"), std::string::npos);
  const auto fill_of = [&](const std::string& title) {
    const auto at = svg.rfind("fill=\"", svg.find("<title>" + title + ":"));
    return svg.substr(at + 6, 7);
  };
  EXPECT_NE(fill_of("0F0"), fill_of("3F0"));
  EXPECT_EQ(fill_of("0F0"), fill_of("1F0"));
  EXPECT_NE(fill_of("0I0"), fill_of("0W0"));
}

// ---- chrome ---------------------------------------------------------------------------------

TEST(RenderChrome, IsJsonWithOneCompleteEventPerComputeActionAtItsSimulatedTime) {
  for (const char* costs : {"F=1,B=2,I=1,W=1", "F=1/3,B=2/3,I=1/3,W=1/3,comm=1/7"}) {
    for (const auto& name : schedule_names()) {
      const auto s = lower(generate(name, 3, 6));
      const auto sim = simulate(s, cost_model::parse(costs));
      const std::string text = render(s, sim, render_format::chrome);
      json doc;
      ASSERT_NO_THROW(doc = json_reader(text).read_document()) << name << "\n" << text;
      ASSERT_EQ(doc.kind, json::type::object);
      const auto& events = doc.at("traceEvents");
      ASSERT_EQ(events.kind, json::type::array);

      std::vector<std::string> thread_names(3);
      std::size_t complete = 0;
      std::vector<std::size_t> next(3, 0);  // per rank, the next compute action to match
      for (const auto& e : events.items) {
        const std::string ph = e.at("ph").text;
        const int tid = static_cast<int>(e.at("tid").number);
        EXPECT_EQ(e.at("pid").number, 0);
        if (ph == "M") {
          if (e.at("name").text == "thread_name") thread_names.at(tid) = e.at("args").at("name").text;
          continue;
        }
        ASSERT_EQ(ph, "X");
        ++complete;
        const auto& row = sim.timeline.at(tid);
        while (next[tid] < row.size() && !is_compute(row[next[tid]].what.kind)) ++next[tid];
        ASSERT_LT(next[tid], row.size());
        const auto& t = row[next[tid]++];
        const std::string letter = t.what.kind == op::recompute ? "R" : to_string(t.what.kind);
        EXPECT_EQ(e.at("name").text, letter + std::to_string(t.what.microbatch));
        EXPECT_EQ(e.at("cat").text, to_string(t.what.kind));
        EXPECT_NEAR(e.at("ts").number, 1000 * t.start.to_double(), 1e-3) << name;
        EXPECT_NEAR(e.at("dur").number, 1000 * (t.end - t.start).to_double(), 2e-3) << name;
        EXPECT_EQ(e.at("args").at("stage").number, t.what.stage);
        EXPECT_EQ(e.at("args").at("microbatch").number, t.what.microbatch);
      }
      EXPECT_EQ(complete, compute_actions(s)) << name;
      EXPECT_EQ(thread_names, (std::vector<std::string>{"rank 0", "rank 1", "rank 2"}));
    }
  }
}

TEST(RenderChrome, WritesWholeMicrosecondsExactlyAndEscapesTheName) {
  auto s = generate("gpipe", 2, 2);
  s.name = "quote\" back\\slash";
  const auto text = draw(s, render_format::chrome);
  EXPECT_NE(text.find("\"name\":\"B1\",\"cat\":\"B\",\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":7000,"
                      "\"dur\":2000,\"args\":{\"stage\":0,\"microbatch\":1}"),
            std::string::npos)
      << text;
  const json doc = json_reader(text).read_document();
  EXPECT_EQ(doc.at("traceEvents").items.at(0).at("args").at("name").text,
            "quote\" back\\slash p=2 m=2 v=1");
}

// ---- formats --------------------------------------------------------------------------------

TEST(RenderFormat, ParsesEachNameAndRejectsOthersListingThem) {
  EXPECT_EQ(render_format_names(), (std::vector<std::string>{"ascii", "csv", "svg", "chrome"}));
  EXPECT_EQ(parse_render_format("ascii"), render_format::ascii);
  EXPECT_EQ(parse_render_format("csv"), render_format::csv);
  EXPECT_EQ(parse_render_format("svg"), render_format::svg);
  EXPECT_EQ(parse_render_format("chrome"), render_format::chrome);
  for (const char* bad : {"", "png", "ASCII", "json"}) {
    try {
      parse_render_format(bad);
      ADD_FAILURE() << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("ascii, csv, svg or chrome"), std::string::npos) << e.what();
    }
  }
}

TEST(RenderFormat, RefusesASimulationOfAnotherSchedule) {
  const auto sim = simulate(generate("1f1b", 2, 2));
  EXPECT_THROW(render(generate("1f1b", 3, 2), sim, render_format::ascii), std::invalid_argument);
  // The same rank count, other actions: every format refuses it too.
  const auto other = simulate(generate("gpipe", 2, 3));
  for (auto f : {render_format::ascii, render_format::svg, render_format::chrome, render_format::csv})
    EXPECT_THROW(render(generate("1f1b", 2, 3), other, f), std::invalid_argument);
  // And a simulation missing a rank's last action.
  auto cut = simulate(generate("1f1b", 2, 3));
  cut.timeline[1].pop_back();
  EXPECT_THROW(render(generate("1f1b", 2, 3), cut, render_format::ascii), std::invalid_argument);
}

TEST(RenderAscii, ScalesDownTimesWhoseDifferencesLeave64BitFractions) {
  // Costs over distinct large primes: the simulation is exact, and so are its times, but the
  // difference of two of them needs more than 64 bits. The picture scales down instead of failing.
  const auto s = generate("1f1b", 4, 8);
  const auto sim = simulate(s, cost_model::parse("F=1/1000000007,B=1/1000000009"));
  const auto lines = lines_of(render(s, sim, render_format::ascii));
  ASSERT_GE(lines.size(), 6u);
  EXPECT_NE(lines[1].find("scaled down"), std::string::npos) << lines[1];
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(lines[2 + r].rfind("rank " + std::to_string(r) + " |", 0), 0u) << lines[2 + r];
    for (const char* label : {"F0", "F7", "B0", "B7"}) EXPECT_NE(lines[2 + r].find(label), std::string::npos) << lines[2 + r];
    EXPECT_LE(lines[2 + r].size(), std::string("rank 0 |").size() + 400 + 1);
  }
}

}  // namespace
