// Reports: escaping, the SVG charts' content and geometry, the refusal of script, the written file.

#include "troupe/core/report.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace troupe {
namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Report, EscapesEveryMarkupCharacter) {
  EXPECT_EQ(html_escape("<img src=x onerror=alert(1)> & \"'"), "&lt;img src=x onerror=alert(1)&gt; &amp; &quot;&#39;");
  EXPECT_EQ(html_escape("plain"), "plain");
}

TEST(Report, ChartDrawsEachSeriesWithItsFinitePointsAndEscapedNames) {
  line_chart c{"accuracy <per> round", "round", "accuracy", {}};
  c.series.push_back({"<b>FedAvg</b>", {{1, 0.5}, {2, 0.6}, {3, NAN}, {4, 0.7}}});
  c.series.push_back({"FedProx", {{1, 0.4}, {2, 0.65}}});
  const std::string svg = render_svg(c);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_EQ(count(svg, "<circle"), 5u);  // the NaN point is left out
  EXPECT_NE(svg.find("&lt;b&gt;FedAvg&lt;/b&gt;"), std::string::npos);
  EXPECT_NE(svg.find("accuracy &lt;per&gt; round"), std::string::npos);
  EXPECT_EQ(svg.find("<b>"), std::string::npos);
  // The first point of the first series sits on the left axis, at x = 72 pixels.
  EXPECT_NE(svg.find("points=\"72.0,"), std::string::npos);
}

TEST(Report, ChartWithoutFiniteValuesSaysSo) {
  line_chart c{"empty", "x", "y", {{"a", {{1, NAN}}}}};
  EXPECT_NE(render_svg(c).find("no finite values"), std::string::npos);
}

TEST(Report, HistogramCountsEveryValueInItsBin) {
  const std::string svg = render_histogram_svg("client accuracy", "accuracy", {0.05, 0.15, 0.15, 2.0, -1.0}, 0, 1, 10);
  EXPECT_EQ(count(svg, "<rect"), 10u);
  EXPECT_THROW((void)render_histogram_svg("h", "x", {1}, 1, 1), std::invalid_argument);
}

TEST(Report, RefusesSvgThatCouldRunScript) {
  report r("t");
  EXPECT_NO_THROW(r.svg("<svg xmlns=\"http://www.w3.org/2000/svg\"><rect width=\"1\" height=\"1\"/></svg>"));
  EXPECT_NO_THROW(r.svg("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg><rect/></svg>"));
  EXPECT_EQ(r.html().find("<?xml"), std::string::npos);
  for (const char* bad : {"<svg onload=\"alert(1)\"></svg>", "<svg><script>alert(1)</script></svg>",
                          "<svg><a href=\"javascript:alert(1)\"/></svg>", "<div></div>", "<svg\nONCLICK = 'x'></svg>"})
    EXPECT_THROW(r.svg(bad), std::invalid_argument) << bad;
}

TEST(Report, PageIsSelfContainedAndWrittenWhole) {
  report r("run <1>");
  r.heading("summary");
  r.table({"option", "value"}, {{"model", "<script>alert(1)</script>"}});
  r.chart({"loss", "step", "loss", {{"train", {{0, 2.3}, {1, 1.1}}}}});
  const std::string page = r.html();
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("http://", page.find("</svg>")), std::string::npos);  // nothing fetched
  const std::string file = ::testing::TempDir() + "/troupe_report_test.html";
  r.write(file);
  std::ifstream in(file);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), page);
  std::remove(file.c_str());
  EXPECT_THROW(r.write("/nonexistent-dir/x.html"), std::runtime_error);
  try {
    check_report_path("/nonexistent-dir/x.html");
    ADD_FAILURE() << "accepted a report path in a missing directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("--report /nonexistent-dir/x.html"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST(Report, ChartBookKeepsChartsAndSeriesInTheOrderOfTheirFirstPoint) {
  chart_book book;
  book.add("accuracy", "test", 1, 0.5, "round", "accuracy");
  book.add("loss", "train", 1, 2.0, "round", "loss");
  book.add("loss", "test", 1, 2.2, "round", "loss");
  book.add("accuracy", "test", 2, 0.6, "round", "accuracy");
  ASSERT_EQ(book.charts().size(), 2u);
  EXPECT_EQ(book.charts()[0].title, "accuracy");
  EXPECT_EQ(book.charts()[0].series[0].points.size(), 2u);
  ASSERT_EQ(book.charts()[1].series.size(), 2u);
  EXPECT_EQ(book.charts()[1].series[1].name, "test");
  report r("t");
  book.add_to(r);
  EXPECT_EQ(count(r.html(), "<svg"), 2u);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {
TEST(Report, NumbersKeepFourDigitsAndWholeThousands) {
  EXPECT_EQ(report_number(0.86071), "0.8607");
  EXPECT_EQ(report_number(4.3121), "4.312");
  EXPECT_EQ(report_number(18550.4), "18550");
  EXPECT_EQ(report_number(NAN), "n/a");
}
TEST(Report, BarChartDrawsABarPerFiniteValueOnAScaleFromZero) {
  bar_chart c{"ops <per> second", "ops/s", {"troupe", "<i>anchor</i>"}, {}};
  c.groups.push_back({"ring", {200, 100}});
  c.groups.push_back({"fan-out", {50, NAN}});
  const std::string svg = render_bar_svg(c);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  // Three bars and two legend swatches.
  EXPECT_EQ(count(svg, "<rect"), 5u);
  EXPECT_NE(svg.find("&lt;i&gt;anchor&lt;/i&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<i>"), std::string::npos);
  // The scale starts at the labels' edge (240 px) and 200 reaches the right end (720 - 70):
  // the bar of 100 is half as wide as that of 200.
  EXPECT_NE(svg.find("x=\"240.0\" y=\"33\" width=\"410.0\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("width=\"205.0\""), std::string::npos);
  c.groups.push_back({"short", {1}});
  EXPECT_THROW(render_bar_svg(c), std::invalid_argument);
  EXPECT_NE(render_bar_svg({"empty", "x", {"a"}, {}}).find("no positive values"), std::string::npos);
}

}  // namespace
}  // namespace troupe
