// tessel reshard end to end: the plan, the round trip, the device options and their errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/cli_test_util.h"

namespace tessel {
namespace {

const std::string kRowsToCols =
    "reshard --mesh fsdp=8 --shape 64,64 --from '[\"fsdp\", null]' --to '[null, \"fsdp\"]'";

TEST(ReshardCli, PrintsThePlanAndChecksTheRoundTrip) {
  Result r = run(kRowsToCols);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("reshard f32[64,64]: PartitionSpec('fsdp', None) on Mesh(fsdp=8)"));
  EXPECT_THAT(r.out, HasSubstr("total: 2.00 KiB already in place, 14.00 KiB copied across devices"));
  EXPECT_THAT(r.out, HasSubstr("round trip bit-identical"));
  EXPECT_THAT(r.out, HasSubstr("     7      4.00 KiB"));  // memory table: source + target
}

TEST(ReshardCli, DevicesComeFromTheFlagOrTheEnvironment) {
  Result r = run("reshard --mesh a=2,b=6 --to-mesh c=12 --shape 12,5 --dtype bf16 --from '[[\"a\",\"b\"]]' "
                 "--to '[null, \"c\"]' --devices 12 --show");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bf16[12,5] source: NamedSharding(mesh=Mesh(c=12)"));
  EXPECT_THAT(r.out, HasSubstr("    11  "));
  Result env = run("reshard --mesh a=4 --shape 8 --from '[\"a\"]' --to '[]' 2>&1; TESSEL_DEVICES=2 " +
                   std::string(TESSEL_CLI) + " reshard --mesh a=4 --shape 8 --from '[\"a\"]' --to '[]'");
  EXPECT_EQ(env.rc, 1);
  EXPECT_THAT(env.err, HasSubstr("Mesh(a=4) uses device 2, but the runtime has devices 0 to 1"));
}

TEST(ReshardCli, BadInputsGiveOneClearLine) {
  expect_one_line_error(run(kRowsToCols + " --devices 4"), 1, "Mesh(fsdp=8) uses device 4, but the runtime has devices 0 to 3");
  expect_one_line_error(run(kRowsToCols + " --devices 0"), 1, "--devices must be at least 1, got 0");
  expect_one_line_error(
      run("reshard --mesh fsdp=8 --shape 64,64 --from '[\"fsdp\"]' --to '[]' --device-memory 10KiB"), 1,
      "device 0: out of memory: cannot allocate 16.00 KiB for source (limit 10.00 KiB, in use 2.00 KiB by source "
      "2.00 KiB in 1 buffer)");
  expect_one_line_error(run(kRowsToCols + " --device-memory lots"), 2, "--device-memory");
  expect_one_line_error(run(kRowsToCols + " --dtype f8"), 1, "f8");
  expect_one_line_error(run("reshard --mesh fsdp=8 --shape 64 --from '[\"fsdp\"]' --to '[\"tensor\"]'"), 1, "tensor");
  expect_one_line_error(run("reshard --mesh fsdp=8 --shape 64,x --from '[]' --to '[]'"), 1, "x");
  expect_one_line_error(run("reshard --mesh fsdp=8 --shape 64 --from '[\"fsdp\"' --to '[]'"), 1, "--from");
  expect_one_line_error(run("reshard --mesh fsdp=8 --shape 64 --from '[]'"), 2, "--to");
  Result env = run("reshard --mesh a=4 --shape 8 --from '[]' --to '[]'");
  EXPECT_EQ(env.rc, 0);
}

}  // namespace
}  // namespace tessel
