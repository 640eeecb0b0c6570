#include <gtest/gtest.h>

#include <cstring>
#include <exception>
#include <set>
#include <string>
#include <system_error>
#include <type_traits>

#include <troupe/core/error.hpp>

namespace {

using troupe::errc;

constexpr errc all_errcs[] = {
    errc::ok,           errc::actor_dead,      errc::mailbox_full,    errc::timeout,
    errc::decode_error, errc::connection_lost, errc::node_lost,       errc::would_deadlock,
    errc::type_mismatch, errc::system_shutdown, errc::broken_promise, errc::name_taken,
};

static_assert(std::is_error_code_enum_v<errc>);
static_assert(!std::is_error_condition_enum_v<errc>);
static_assert(std::is_base_of_v<std::system_error, troupe::error>);

TEST(Error, KeepsTheWireNumberingOfEveryCode) {
  // The numbers travel on the wire: changing one breaks compatibility between nodes.
  EXPECT_EQ(static_cast<int>(errc::ok), 0);
  EXPECT_EQ(static_cast<int>(errc::actor_dead), 1);
  EXPECT_EQ(static_cast<int>(errc::mailbox_full), 2);
  EXPECT_EQ(static_cast<int>(errc::timeout), 3);
  EXPECT_EQ(static_cast<int>(errc::decode_error), 4);
  EXPECT_EQ(static_cast<int>(errc::connection_lost), 5);
  EXPECT_EQ(static_cast<int>(errc::node_lost), 6);
  EXPECT_EQ(static_cast<int>(errc::would_deadlock), 7);
  EXPECT_EQ(static_cast<int>(errc::type_mismatch), 8);
  EXPECT_EQ(static_cast<int>(errc::system_shutdown), 9);
  EXPECT_EQ(static_cast<int>(errc::broken_promise), 10);
  EXPECT_EQ(static_cast<int>(errc::name_taken), 11);
}

TEST(Error, NamesItsCategoryTroupe) {
  EXPECT_STREQ(troupe::error_category().name(), "troupe");
  for (errc e : all_errcs) {
    const std::error_code ec = troupe::make_error_code(e);
    EXPECT_STREQ(ec.category().name(), "troupe") << static_cast<int>(e);
    EXPECT_EQ(ec.value(), static_cast<int>(e));
  }
}

TEST(Error, HasOneCategoryInstance) {
  // std::error_code compares categories by address.
  EXPECT_EQ(&troupe::error_category(), &troupe::error_category());
  EXPECT_EQ(&troupe::make_error_code(errc::timeout).category(), &troupe::error_category());
  EXPECT_NE(troupe::error_category(), std::generic_category());
  EXPECT_NE(troupe::error_category(), std::system_category());
}

TEST(Error, GivesEveryCodeADistinctNonEmptyMessage) {
  std::set<std::string> messages;
  for (errc e : all_errcs) {
    const std::string m = troupe::make_error_code(e).message();
    EXPECT_FALSE(m.empty()) << static_cast<int>(e);
    EXPECT_EQ(m.find("unknown"), std::string::npos) << static_cast<int>(e) << ": " << m;
    messages.insert(m);
  }
  EXPECT_EQ(messages.size(), std::size(all_errcs));
}

TEST(Error, DescribesAnUnknownValueWithItsNumber) {
  const std::string m = troupe::error_category().message(4242);
  EXPECT_NE(m.find("4242"), std::string::npos) << m;
  for (errc e : all_errcs) EXPECT_NE(m, troupe::make_error_code(e).message());
}

TEST(Error, CarriesItsCode) {
  for (errc e : all_errcs) {
    const troupe::error err(e);
    EXPECT_EQ(err.code_value(), e);
    EXPECT_EQ(err.code(), troupe::make_error_code(e));
    EXPECT_EQ(&err.code().category(), &troupe::error_category());
  }
  const troupe::error with_text(errc::mailbox_full, "mailbox of actor 7");
  EXPECT_EQ(with_text.code_value(), errc::mailbox_full);
  EXPECT_NE(std::string(with_text.what()).find("mailbox of actor 7"), std::string::npos)
      << with_text.what();
}

TEST(Error, IsCatchableAsSystemError) {
  try {
    throw troupe::error(errc::would_deadlock, "get() on an actor thread");
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::would_deadlock);
    EXPECT_EQ(e.code().category().name(), std::string("troupe"));
    return;
  } catch (...) {
    FAIL() << "troupe::error was not caught as std::system_error";
  }
  FAIL() << "nothing was thrown";
}

TEST(Error, IsCatchableAsStdExceptionWithItsMessage) {
  try {
    throw troupe::error(errc::node_lost);
  } catch (const std::exception& e) {
    const auto* as_troupe = dynamic_cast<const troupe::error*>(&e);
    ASSERT_NE(as_troupe, nullptr);
    EXPECT_EQ(as_troupe->code_value(), errc::node_lost);
    EXPECT_NE(std::string(e.what()).find(troupe::make_error_code(errc::node_lost).message()),
              std::string::npos)
        << e.what();
  }
}

TEST(Error, ComparesErrorCodesWithErrc) {
  const std::error_code ec = errc::timeout;  // implicit through std::is_error_code_enum
  EXPECT_EQ(ec, troupe::make_error_code(errc::timeout));
  EXPECT_TRUE(ec == errc::timeout);
  EXPECT_FALSE(ec == errc::actor_dead);
  EXPECT_TRUE(ec != errc::decode_error);
  EXPECT_TRUE(static_cast<bool>(ec));

  // The same number in another category is a different error.
  EXPECT_FALSE(std::error_code(3, std::generic_category()) == errc::timeout);
  EXPECT_FALSE(std::error_code(3, std::system_category()) == errc::timeout);
  EXPECT_FALSE(ec == std::errc::timed_out);
  EXPECT_FALSE(ec == std::make_error_code(std::errc::no_such_process));

  std::error_code assigned;
  EXPECT_FALSE(static_cast<bool>(assigned));
  assigned = errc::name_taken;
  EXPECT_EQ(assigned.value(), 11);
  EXPECT_EQ(assigned, errc::name_taken);
  EXPECT_EQ(assigned.category(), troupe::error_category());

  const std::error_code ok = errc::ok;  // value 0: no error, whatever the category
  EXPECT_FALSE(static_cast<bool>(ok));
  EXPECT_EQ(ok.category(), troupe::error_category());
}

TEST(Error, DistinguishesEveryPairOfCodes) {
  for (errc a : all_errcs) {
    for (errc b : all_errcs) {
      const std::error_code ea = a;
      EXPECT_EQ(ea == b, a == b) << static_cast<int>(a) << " vs " << static_cast<int>(b);
    }
  }
}

}  // namespace
