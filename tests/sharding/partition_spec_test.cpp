#include "tessel/sharding/partition_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/error.h"
#include "tessel/sharding/mesh.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(PartitionSpec, PrintsLikeJax) {
  PartitionSpec spec{{"fsdp"}, {}, {"data", "tensor"}};
  EXPECT_EQ(spec.to_string(), "PartitionSpec('fsdp', None, ('data', 'tensor'))");
  EXPECT_EQ(PartitionSpec().to_string(), "PartitionSpec()");
}

TEST(PartitionSpec, JsonIsJaxNormalized) {
  PartitionSpec spec{{"fsdp"}, {}, {"data", "tensor"}};
  EXPECT_EQ(spec.to_json(), R"(["fsdp",null,["data","tensor"]])");
  EXPECT_EQ(PartitionSpec().to_json(), "[]");
  // A 1-tuple reads as its axis, an empty tuple as null: both compare equal to the normal form.
  EXPECT_EQ(PartitionSpec::from_json(R"([["fsdp"], [], null, "x"])"),
            (PartitionSpec{{"fsdp"}, {}, {}, {"x"}}));
  EXPECT_EQ(PartitionSpec::from_json(R"([["fsdp"], []])").to_json(), R"(["fsdp",null])");
}

TEST(PartitionSpec, BadJsonGivesClearErrors) {
  EXPECT_THAT([] { PartitionSpec::from_json(R"(["fsdp", )"); },
              ThrowsMessage<ParseError>(HasSubstr("spec:1:")));
  EXPECT_THAT([] { PartitionSpec::from_json(R"({"a": 1})"); },
              ThrowsMessage<ValueError>(HasSubstr("must be a JSON array")));
  EXPECT_THAT([] { PartitionSpec::from_json(R"(["a", 3])"); },
              ThrowsMessage<ValueError>(HasSubstr("dimension 1 is a number")));
  EXPECT_THAT([] { PartitionSpec::from_json(R"([["a", null]])"); },
              ThrowsMessage<ValueError>(HasSubstr("dimension 0 lists a null")));
  EXPECT_THAT([] { PartitionSpec::from_json(R"(["a", ["b", "a"]])"); },
              ThrowsMessage<ValueError>(HasSubstr("'a' twice")));
  EXPECT_THAT([] { PartitionSpec::from_json(R"([""])"); },
              ThrowsMessage<ValueError>(HasSubstr("empty mesh axis")));
}

TEST(PartitionSpec, AnAxisCanSplitOnlyOneDimension) {
  EXPECT_THAT([] { PartitionSpec({{"x"}, {"x"}}); }, ThrowsMessage<ValueError>(HasSubstr("'x' twice")));
  EXPECT_THAT([] { PartitionSpec({{"x", "x"}}); }, ThrowsMessage<ValueError>(HasSubstr("'x' twice")));
}

TEST(PartitionSpec, ValidatesAgainstMeshAndRank) {
  Mesh mesh = Mesh::parse("data=2,fsdp=4");
  PartitionSpec spec{{"fsdp"}, {"model"}};
  EXPECT_THAT([&] { spec.validate(mesh, 2, "params/w"); },
              ThrowsMessage<ValueError>(HasSubstr("params/w: partition spec PartitionSpec('fsdp', 'model') "
                                                  "dimension 1 uses mesh axis 'model'")));
  EXPECT_THAT([&] { PartitionSpec({{"fsdp"}, {}, {}}).validate(mesh, 2); },
              ThrowsMessage<ValueError>(HasSubstr("3 entries but the array has rank 2")));
  PartitionSpec({{"fsdp"}}).validate(mesh, 3);  // fewer entries than dimensions is fine
  EXPECT_EQ(spec.used_axes(), (std::vector<std::string>{"fsdp", "model"}));
}

}  // namespace
}  // namespace tessel
