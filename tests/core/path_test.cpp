// Path arguments: URLs are told apart from paths, and only file:///path is taken as one.
#include "tessel/core/path.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(UrlScheme, IsTheLowercasedSchemeOfAUrlAndEmptyForAPath) {
  EXPECT_EQ(url_scheme("s3://bucket/run"), "s3");
  EXPECT_EQ(url_scheme("GS://bucket"), "gs");
  EXPECT_EQ(url_scheme("tensorstore+s3://b/x"), "tensorstore+s3");
  EXPECT_EQ(url_scheme("file:///tmp/x"), "file");
  for (const char* path : {"/tmp/ckpt", "ckpt/7", "run:1/x", "./s3:/bucket", "a/b://c", "1s3://x", "://x", "", "s3:"})
    EXPECT_EQ(url_scheme(path), "") << path;
}

TEST(LocalPath, KeepsPathsAndTakesTheFileUrlsOfThisMachine) {
  EXPECT_EQ(local_path("ckpt/7", "dir"), "ckpt/7");
  EXPECT_EQ(local_path("run:1/x", "dir"), "run:1/x");
  EXPECT_EQ(local_path("file:///tmp/ckpt", "dir"), "/tmp/ckpt");
  EXPECT_EQ(local_path("FILE://localhost/tmp/a%20b%2Fc", "dir"), "/tmp/a b/c");
}

TEST(LocalPath, RefusesEveryOtherUrlNamingTheArgument) {
  for (const char* url : {"s3://my-bucket/run", "gs://b/ckpt", "http://host/x", "https://host/x", "hf://org/model",
                          "az://c/x", "Gs://b"}) {
    try {
      local_path(url, "--checkpoint-dir");
      ADD_FAILURE() << url << " was taken as a path";
    } catch (const ValueError& e) {
      EXPECT_THAT(e.what(), StartsWith(std::string("--checkpoint-dir: '") + url + "'"));
      EXPECT_THAT(e.what(), HasSubstr("not supported yet"));
    }
  }
  EXPECT_THROW(local_path("file://server/share/x", "dst"), ValueError);
  EXPECT_THROW(local_path("file://server", "dst"), ValueError);
  EXPECT_THROW(local_path("file:///tmp/x?y=1", "dst"), ValueError);
  EXPECT_THROW(local_path("file:///tmp/x#y", "dst"), ValueError);
  EXPECT_THROW(local_path("file:///tmp/%zz", "dst"), ValueError);
  EXPECT_THROW(local_path("file:///tmp/%2", "dst"), ValueError);
  EXPECT_THROW(local_path("file:///tmp/a%00b", "dst"), ValueError);
  try {
    local_path("s3://b/x", "");
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), StartsWith("'s3://b/x' is a URL (s3://)"));
  }
}

}  // namespace
}  // namespace tessel
