// The S3 client's pieces that need no server: Signature Version 4 against AWS's published example,
// and the configuration taken from the environment and the AWS files. The requests themselves run
// against a local S3 server in tests/python/test_s3.py.
#include "tessel/checkpoint/detail/io/s3.h"

#include <cstdlib>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace tessel::detail {
namespace {
using ::testing::HasSubstr;

// AWS's "Example: GET Object" of the Signature Version 4 documentation (Authenticating Requests:
// Using the Authorization Header): its canonical request and its signature.
TEST(SigV4, SignsAwsPublishedGetObjectExample) {
  SignedRequest r;
  r.method = "GET";
  r.canonical_uri = "/test.txt";
  r.payload_hash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  r.headers = {{"host", "examplebucket.s3.amazonaws.com"},
               {"range", "bytes=0-9"},
               {"x-amz-content-sha256", r.payload_hash},
               {"x-amz-date", "20130524T000000Z"}};
  const S3Credentials c{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
  EXPECT_EQ(sigv4_authorization(r, c, "us-east-1", "s3", "20130524T000000Z"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(sha256_hex({}), r.payload_hash);
  EXPECT_EQ(md5_base64({}), "1B2M2Y8AsgTpgAmY7PhCfg==");
}

using Env = testing::ScopedEnv;

TEST(S3Config, TakesTheEnvironmentThenTheProfileFiles) {
  testing::TempDir tmp;
  Env env;
  for (const char* n : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                        "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"})
    env.unset(n);
  std::ofstream(tmp.path() / "credentials") << "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key=sd\n"
                                               "# a comment\n[work]\naws_access_key_id=AKWORK\naws_secret_access_key = sw\n";
  std::ofstream(tmp.path() / "config") << "[default]\nregion = eu-west-1\n[profile work]\nregion=ap-south-1\n"
                                          "endpoint_url = http://127.0.0.1:9000/\ns3 =\n  addressing_style = path\n";
  env.set("AWS_SHARED_CREDENTIALS_FILE", (tmp.path() / "credentials").string());
  env.set("AWS_CONFIG_FILE", (tmp.path() / "config").string());
  S3Config c = S3Config::from_environment();
  ASSERT_TRUE(c.credentials);
  EXPECT_EQ(c.credentials->access_key, "AKDEFAULT");
  EXPECT_EQ(c.region, "eu-west-1");
  EXPECT_EQ(c.endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(c.path_style);
  env.set("AWS_PROFILE", "work");
  c = S3Config::from_environment();
  EXPECT_EQ(c.credentials->access_key, "AKWORK");
  EXPECT_EQ(c.credentials->secret_key, "sw");
  EXPECT_EQ(c.region, "ap-south-1");
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:9000");
  EXPECT_TRUE(c.path_style);
  env.set("AWS_ACCESS_KEY_ID", "AKENV");
  env.set("AWS_SECRET_ACCESS_KEY", "se");
  env.set("AWS_REGION", "us-west-2");
  env.set("AWS_ENDPOINT_URL_S3", "https://minio.example:9000");
  c = S3Config::from_environment();
  EXPECT_EQ(c.credentials->access_key, "AKENV");
  EXPECT_EQ(c.region, "us-west-2");
  EXPECT_EQ(c.endpoint, "https://minio.example:9000");
  env.set("AWS_PROFILE", "missing");
  env.unset("AWS_ACCESS_KEY_ID");
  c = S3Config::from_environment();
  EXPECT_FALSE(c.credentials);
  EXPECT_THAT(c.credentials_hint, HasSubstr("profile 'missing' has no aws_access_key_id"));
  env.set("AWS_ACCESS_KEY_ID", "AKENV");
  env.unset("AWS_SECRET_ACCESS_KEY");
  EXPECT_THAT([] { S3Config::from_environment(); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("AWS_SECRET_ACCESS_KEY is not")));
  env.set("AWS_SECRET_ACCESS_KEY", "se");
  env.set("AWS_ENDPOINT_URL_S3", "minio:9000");
  EXPECT_THAT([] { S3Config::from_environment(); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("not an http:// or https:// URL")));
  env.unset("AWS_ENDPOINT_URL_S3");
  std::ofstream(tmp.path() / "config") << "[default\nregion = x\n";
  EXPECT_THAT([] { S3Config::from_environment(); }, ::testing::Throws<ParseError>());
}

}  // namespace
}  // namespace tessel::detail
