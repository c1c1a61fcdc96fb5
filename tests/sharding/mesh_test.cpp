#include "tessel/sharding/mesh.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(Mesh, ParsesAxesInOrderWithRowMajorDevices) {
  Mesh m = Mesh::parse("data=2, fsdp=4");
  EXPECT_EQ(m.axis_names(), (std::vector<std::string>{"data", "fsdp"}));
  EXPECT_EQ(m.device_count(), 8);
  EXPECT_EQ(m.axis_size("fsdp"), 4);
  EXPECT_EQ(m.axis_index("fsdp"), 1u);
  EXPECT_THAT(m.coords(5), ElementsAre(1, 1));
  EXPECT_THAT(m.coords(3), ElementsAre(0, 3));
  EXPECT_EQ(m.to_string(), "Mesh(data=2, fsdp=4)");
  for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(m.device_at(m.coords(d)), d);
}

TEST(Mesh, ExplicitDeviceIdsAreLaidOutRowMajor) {
  Mesh m({{"x", 2}, {"y", 2}}, {7, 3, 5, 1});
  EXPECT_THAT(m.coords(5), ElementsAre(1, 0));
  EXPECT_EQ(m.device_at(std::vector<int64_t>{0, 1}), 3);
  EXPECT_THAT([&] { m.coords(0); }, ThrowsMessage<ValueError>(HasSubstr("device 0 is not in mesh")));
}

TEST(Mesh, SubgroupsShareAllOtherCoordinates) {
  Mesh m = Mesh::parse("data=2,fsdp=2,tensor=2");
  EXPECT_EQ(m.subgroups({"tensor"}),
            (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.subgroups({"data"}), (std::vector<std::vector<int64_t>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // Within a group, the first listed axis is major.
  EXPECT_EQ(m.subgroups({"data", "tensor"}), (std::vector<std::vector<int64_t>>{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(m.subgroups({"tensor", "data"}), (std::vector<std::vector<int64_t>>{{0, 4, 1, 5}, {2, 6, 3, 7}}));
  EXPECT_EQ(m.subgroups(std::vector<std::string>{}).size(), 8u);
  EXPECT_EQ(m.subgroups({"data", "fsdp", "tensor"}).size(), 1u);
  EXPECT_THAT([&] { m.subgroups({"model"}); }, ThrowsMessage<ValueError>(HasSubstr("no axis 'model'")));
  EXPECT_THAT([&] { m.subgroups({"data", "data"}); }, ThrowsMessage<ValueError>(HasSubstr("twice")));
}

TEST(Mesh, BadTextNamesTheOffendingItem) {
  EXPECT_THAT([] { Mesh::parse(""); }, ThrowsMessage<ValueError>(HasSubstr("empty")));
  EXPECT_THAT([] { Mesh::parse("data=2,fsdp"); }, ThrowsMessage<ValueError>(HasSubstr("'fsdp' is not axis=size")));
  EXPECT_THAT([] { Mesh::parse("data=two"); }, ThrowsMessage<ValueError>(HasSubstr("size 'two'")));
  EXPECT_THAT([] { Mesh::parse("data=2.5"); }, ThrowsMessage<ValueError>(HasSubstr("size '2.5'")));
  EXPECT_THAT([] { Mesh::parse("data=0"); }, ThrowsMessage<ValueError>(HasSubstr("'data' has size 0")));
  EXPECT_THAT([] { Mesh::parse("data=-2"); }, ThrowsMessage<ValueError>(HasSubstr("'data' has size -2")));
  EXPECT_THAT([] { Mesh::parse("data=2,data=4"); }, ThrowsMessage<ValueError>(HasSubstr("'data' appears twice")));
  EXPECT_THAT([] { Mesh::parse("=2"); }, ThrowsMessage<ValueError>(HasSubstr("empty axis name")));
  EXPECT_THAT([] { Mesh::parse("a=99999999999,b=99999999999"); }, ThrowsMessage<ValueError>(HasSubstr("more than 1048576 devices")));
  EXPECT_THAT([] { Mesh::parse("fsdp=1000000000"); }, ThrowsMessage<ValueError>(HasSubstr("more than 1048576 devices")));
  EXPECT_THAT([] { Mesh::parse("a=99999999999999999999"); }, ThrowsMessage<ValueError>(HasSubstr("not an integer")));
}

TEST(Mesh, DeviceListMustMatchTheAxes) {
  EXPECT_THAT([] { Mesh({{"x", 2}}, {0, 1, 2}); }, ThrowsMessage<ValueError>(HasSubstr("needs 2 devices")));
  EXPECT_THAT([] { Mesh({{"x", 2}}, {1, 1}); }, ThrowsMessage<ValueError>(HasSubstr("appears twice")));
  EXPECT_THAT([] { Mesh({{"x", 2}}, {0, -1}); }, ThrowsMessage<ValueError>(HasSubstr("negative")));
}

TEST(Mesh, DeclaredAxesFillMissingOnesWithSizeOne) {
  std::vector<std::string> declared{"data", "stage", "fsdp", "tensor"};
  Mesh m = Mesh::parse("fsdp=4,tensor=2", declared);
  EXPECT_EQ(m.axis_names(), declared);
  EXPECT_EQ(m.axis_size("stage"), 1);
  EXPECT_EQ(m.device_count(), 8);
  EXPECT_THAT([&] { Mesh::parse("fsdp=4,model=2", declared); },
              ThrowsMessage<ValueError>(HasSubstr("'model' is not among the declared mesh_axes")));
  EXPECT_THAT([&] { Mesh::parse("tensor=2,fsdp=4", declared); },
              ThrowsMessage<ValueError>(HasSubstr("mesh_axes order")));
  EXPECT_EQ(Mesh::parse("fsdp=4", std::vector<std::string>{}), Mesh::parse("fsdp=4"));
}

}  // namespace
}  // namespace tessel
