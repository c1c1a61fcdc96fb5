// Locations: local paths as given, bucket URLs parsed and checked, names appended and checked.
#include "tessel/core/location.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(Location, ParsesBucketsAndKeepsPaths) {
  const Location s3 = Location::parse("s3://my-bucket/runs/llama/", "dir");
  EXPECT_EQ(s3.kind(), Location::Kind::kS3);
  EXPECT_EQ(s3.bucket(), "my-bucket");
  EXPECT_EQ(s3.key(), "runs/llama");
  EXPECT_EQ(s3.string(), "s3://my-bucket/runs/llama");
  EXPECT_EQ((s3 / "7" / "items").string(), "s3://my-bucket/runs/llama/7/items");
  EXPECT_EQ((s3 / "7/items").key(), "runs/llama/7/items");
  EXPECT_EQ((s3 / "7").parent(), s3);
  EXPECT_EQ((s3 / "7").filename(), "7");
  const Location root = Location::parse("gs://bucket.with.dots", "dir");
  EXPECT_EQ(root.kind(), Location::Kind::kGcs);
  EXPECT_EQ(root.key(), "");
  EXPECT_EQ((root / "x").string(), "gs://bucket.with.dots/x");
  EXPECT_EQ((root / "x").parent(), root);
  EXPECT_TRUE(Location::parse("ckpt/7", "dir").is_local());
  EXPECT_EQ(Location::parse("file:///tmp/ckpt", "dir").local(), "/tmp/ckpt");
  EXPECT_EQ(Location("./s3:/bucket").local(), "./s3:/bucket");  // a path is never parsed
  EXPECT_EQ(Location(std::string("s3://b12/x")).kind(), Location::Kind::kS3);
  EXPECT_EQ(Location(std::filesystem::path("s3://b12/x")).string(), "s3://b12/x");  // a URL in a path is the URL
}

TEST(Location, RefusesBadUrlsNamingTheArgument) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"s3://", "has no bucket name"},
      {"s3:///key", "has no bucket name"},
      {"s3://ab/x", "3 to 222"},
      {"s3://My-Bucket/x", "lowercase letters"},
      {"s3://-bucket/x", "start and end with a letter or digit"},
      {"s3://bucket/a//b", "empty name"},
      {"s3://bucket/a/../b", "'..'"},
      {"s3://bucket/./b", "'.'"},
      {"s3://bucket/x?versionId=2", "query or fragment"},
      {"https://example.com/x", "checkpoints are local paths"},
      {"hf://org/model", "checkpoints are local paths"},
      {"file://otherhost/x", "not supported yet"},
  };
  for (const auto& [given, why] : bad) {
    const std::string text = given;  // clang 14 cannot capture a structured binding
    EXPECT_THAT([&] { Location::parse(text, "--dir"); },
                ::testing::ThrowsMessage<ValueError>(::testing::AllOf(StartsWith("--dir: '" + text + "'"), HasSubstr(why))))
        << text;
  }
  const Location s3 = Location::parse("s3://bucket/run", "dir");
  EXPECT_THAT([&] { (void)(s3 / "../other"); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("'..'")));
  EXPECT_THAT([&] { (void)s3.local("dir"); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("needs a local path")));
}

}  // namespace
}  // namespace tessel
