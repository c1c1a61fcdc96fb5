#include "tessel/core/error.h"

#include <gtest/gtest.h>

namespace tessel {
namespace {

TEST(Error, ParseErrorNamesFileLineAndColumn) {
  ParseError e("rules.yml", 12, 3, "bad entry");
  EXPECT_STREQ(e.what(), "rules.yml:12:3: bad entry");
  EXPECT_EQ(e.line(), 12);
  EXPECT_EQ(e.column(), 3);
  EXPECT_STREQ(ParseError("a.json", 4, 0, "x").what(), "a.json:4: x");
  EXPECT_STREQ(ParseError("a.json", 0, 0, "x").what(), "a.json: x");
}

TEST(Error, HierarchyLetsCallersCatchEverythingAsError) {
  EXPECT_THROW(throw ShardingError("s"), Error);
  EXPECT_THROW(throw ValueError("v"), Error);
  EXPECT_THROW(throw IoError("i"), Error);
  EXPECT_THROW(throw ParseError("f", 1, 1, "p"), Error);
}

}  // namespace
}  // namespace tessel
