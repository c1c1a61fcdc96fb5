#include "tessel/sharding/spec_io.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(SpecIo, ReadsLogicalDumpsInFileOrder) {
  auto entries = parse_logical_dump(R"({
    "z/w": {"partition_spec": ["embed", null], "shape": [4, 2]},
    "a/step": {"partition_spec": [], "shape": []}})");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].path, "z/w");
  EXPECT_EQ(entries[0].axes, (LogicalAxes{"embed", std::nullopt}));
  EXPECT_EQ(entries[0].shape, (Shape{4, 2}));
  EXPECT_EQ(entries[1].shape.rank(), 0u);
}

TEST(SpecIo, BadLogicalDumpsNameTheEntry) {
  auto bad = [](const char* text) { return [text] { parse_logical_dump(text, "l.json"); }; };
  EXPECT_THAT(bad("[1]"), ThrowsMessage<ParseError>(HasSubstr("expected a JSON object")));
  EXPECT_THAT(bad(R"({"w": 3})"), ThrowsMessage<ParseError>(HasSubstr("entry 'w': expected an object")));
  EXPECT_THAT(bad(R"({"w": {"shape": [2]}})"), ThrowsMessage<ParseError>(HasSubstr("entry 'w': missing \"partition_spec\"")));
  EXPECT_THAT(bad(R"({"w": {"partition_spec": ["a"]}})"), ThrowsMessage<ParseError>(HasSubstr("missing \"shape\"")));
  EXPECT_THAT(bad(R"({"w": {"partition_spec": ["a"], "shape": [-2]}})"),
              ThrowsMessage<ParseError>(HasSubstr("dimension 0 is -2, not a non-negative integer")));
  EXPECT_THAT(bad(R"({"w": {"partition_spec": ["a"], "shape": [2.5]}})"),
              ThrowsMessage<ParseError>(HasSubstr("dimension 0 is 2.5")));
  EXPECT_THAT(bad(R"({"w": {"partition_spec": ["a"], "shape": [2, 3]}})"),
              ThrowsMessage<ParseError>(HasSubstr("\"partition_spec\" has 1 entries but \"shape\" [2, 3] has rank 2")));
  EXPECT_THAT(bad(R"({"w": {"partition_spec": [["a", "b"]], "shape": [2]}})"),
              ThrowsMessage<ParseError>(HasSubstr("one logical name or null per dimension")));
  EXPECT_THAT(bad(R"({"w": {"partition_spec": "a", "shape": [2]}})"),
              ThrowsMessage<ParseError>(HasSubstr("must be an array")));
  EXPECT_THAT(bad("{\"w\": "), ThrowsMessage<ParseError>(HasSubstr("l.json:1:")));
  // Found by fuzzing: a number too large for a double is a parse error, not a crash.
  EXPECT_THAT(bad(R"({"w": {"partition_spec": [], "shape": [1e999]}})"),
              ThrowsMessage<ParseError>(HasSubstr("unsupported JSON: number overflow")));
}

TEST(SpecIo, NamedDumpRoundTrips) {
  Mesh mesh = Mesh::parse("data=2,fsdp=4");
  std::vector<NamedEntry> entries{{"step", PartitionSpec(), Shape{}},
                                  {"w", PartitionSpec{{"fsdp"}, {}, {"data", "fsdp2"}}, Shape{8, 3, 4}}};
  std::string text = named_dump_json(entries, mesh);
  EXPECT_THAT(text, HasSubstr("\"partition_spec\": [],"));
  auto back = parse_named_dump(text);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].entry.spec, entries[1].spec);
  EXPECT_EQ(back[1].entry.shape, entries[1].shape);
  EXPECT_EQ(back[1].mesh, mesh);
}

TEST(SpecIo, BadNamedDumpMeshesNameTheEntry) {
  auto bad = [](const char* mesh) {
    std::string text = std::string(R"({"w": {"mesh": )") + mesh + R"(, "partition_spec": [], "shape": [4]}})";
    return [text] { parse_named_dump(text, "n.json"); };
  };
  EXPECT_THAT(bad(R"({"axis_names": ["a"], "shape": {"a": 0}})"),
              ThrowsMessage<ParseError>(HasSubstr("entry 'w': mesh axis 'a' has size 0")));
  EXPECT_THAT(bad(R"({"axis_names": ["a"], "shape": {"a": -3}})"), ThrowsMessage<ParseError>(HasSubstr("size -3")));
  EXPECT_THAT(bad(R"({"axis_names": ["a"], "shape": {"a": 18446744073709551615}})"),
              ThrowsMessage<ParseError>(HasSubstr("no integer size for axis 'a'")));
  EXPECT_THAT(bad(R"({"axis_names": ["a", "a"], "shape": {"a": 2}})"),
              ThrowsMessage<ParseError>(HasSubstr("'a' appears twice")));
  EXPECT_THAT(bad(R"({"axis_names": ["a"], "shape": {"b": 2}})"),
              ThrowsMessage<ParseError>(HasSubstr("no integer size for axis 'a'")));
  EXPECT_THAT(bad(R"({"axis_names": "a", "shape": {}})"),
              ThrowsMessage<ParseError>(HasSubstr("needs an \"axis_names\" array")));
}

}  // namespace
}  // namespace tessel
