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

constexpr const char* kAwsVariables[] = {
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME", "AWS_ENDPOINT_URL_STS", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_EC2_METADATA_DISABLED", "AWS_EC2_METADATA_SERVICE_ENDPOINT"};

TEST(S3Config, TakesTheEnvironmentThenTheProfileFiles) {
  testing::TempDir tmp;
  Env env;
  for (const char* n : kAwsVariables) env.unset(n);
  env.set("AWS_EC2_METADATA_DISABLED", "true");  // whatever machine runs the test
  std::ofstream(tmp.path() / "credentials") << "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key=sd\n"
                                               "# a comment\n[work]\naws_access_key_id=AKWORK\naws_secret_access_key = sw\n";
  std::ofstream(tmp.path() / "config") << "[default]\nregion = eu-west-1\n[profile work]\nregion=ap-south-1\n"
                                          "endpoint_url = http://127.0.0.1:9000/\ns3 =\n  addressing_style = path\n";
  env.set("AWS_SHARED_CREDENTIALS_FILE", (tmp.path() / "credentials").string());
  env.set("AWS_CONFIG_FILE", (tmp.path() / "config").string());
  S3Config c = S3Config::from_environment();
  ASSERT_TRUE(c.credentials);
  EXPECT_EQ(c.credentials->get().access_key, "AKDEFAULT");
  EXPECT_EQ(c.region, "eu-west-1");
  EXPECT_EQ(c.endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(c.path_style);
  env.set("AWS_PROFILE", "work");
  c = S3Config::from_environment();
  EXPECT_EQ(c.credentials->get().access_key, "AKWORK");
  EXPECT_EQ(c.credentials->get().secret_key, "sw");
  EXPECT_EQ(c.region, "ap-south-1");
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:9000");
  EXPECT_TRUE(c.path_style);
  env.set("AWS_ACCESS_KEY_ID", "AKENV");
  env.set("AWS_SECRET_ACCESS_KEY", "se");
  env.set("AWS_REGION", "us-west-2");
  env.set("AWS_ENDPOINT_URL_S3", "https://minio.example:9000");
  c = S3Config::from_environment();
  EXPECT_EQ(c.credentials->get().access_key, "AKENV");
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


TEST(S3Config, FindsTemporaryCredentialsInTheSdksOrder) {
  testing::TempDir tmp;
  Env env;
  for (const char* n : kAwsVariables) env.unset(n);
  env.set("AWS_SHARED_CREDENTIALS_FILE", (tmp.path() / "none").string());
  env.set("AWS_CONFIG_FILE", (tmp.path() / "config").string());
  std::ofstream(tmp.path() / "config") << "[default]\nregion = eu-west-1\n[profile eks]\n"
                                          "web_identity_token_file = /var/run/token\nrole_arn = arn:aws:iam::1:role/p\n";
  env.set("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1234/");
  S3Config c = S3Config::from_environment();
  ASSERT_TRUE(c.credentials);
  EXPECT_EQ(c.credentials->kind(), AwsCredentialSource::Kind::kInstanceMetadata);
  EXPECT_EQ(c.credentials->where(), "the EC2 instance metadata service at http://127.0.0.1:1234");
  env.set("AWS_EC2_METADATA_DISABLED", "true");
  c = S3Config::from_environment();
  EXPECT_FALSE(c.credentials);
  EXPECT_THAT(c.credentials_hint, HasSubstr("no web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN), container"));
  // A container's endpoint comes before the instance's.
  env.set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/abc");
  c = S3Config::from_environment();
  EXPECT_EQ(c.credentials->kind(), AwsCredentialSource::Kind::kContainer);
  EXPECT_EQ(c.credentials->where(), "the container credentials endpoint http://169.254.170.2/v2/credentials/abc");
  env.unset("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  for (const char* url : {"http://127.0.0.1:5/creds", "https://creds.example/x", "http://[fd00:ec2::23]/v1"}) {
    env.set("AWS_CONTAINER_CREDENTIALS_FULL_URI", url);
    EXPECT_EQ(S3Config::from_environment().credentials->kind(), AwsCredentialSource::Kind::kContainer) << url;
  }
  for (const char* url : {"http://creds.example/x", "http://127.0.0.1.evil.example/x", "file:///etc/passwd"}) {
    env.set("AWS_CONTAINER_CREDENTIALS_FULL_URI", url);
    EXPECT_THAT([] { S3Config::from_environment(); },
                ::testing::ThrowsMessage<ValueError>(HasSubstr("is neither https:// nor on the loopback")))
        << url;
  }
  // A web identity comes first: from the environment, or the profile's.
  env.set("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/trainer");
  EXPECT_THAT([] { S3Config::from_environment(); }, ::testing::Throws<ValueError>());  // the container URL still bad
  env.unset("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  c = S3Config::from_environment();
  EXPECT_FALSE(c.credentials);  // a role without a token file is no web identity
  env.set("AWS_WEB_IDENTITY_TOKEN_FILE", (tmp.path() / "token").string());
  c = S3Config::from_environment();
  ASSERT_TRUE(c.credentials);
  EXPECT_EQ(c.credentials->kind(), AwsCredentialSource::Kind::kWebIdentity);
  EXPECT_EQ(c.credentials->where(), "web identity (role arn:aws:iam::123456789012:role/trainer, token file " +
                                        (tmp.path() / "token").string() + ") at https://sts.eu-west-1.amazonaws.com");
  EXPECT_THAT([&] { c.credentials->get(); }, ::testing::ThrowsMessage<IoError>(HasSubstr("cannot read the token file")));
  env.unset("AWS_WEB_IDENTITY_TOKEN_FILE");
  env.unset("AWS_ROLE_ARN");
  env.set("AWS_PROFILE", "eks");
  env.set("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9/");
  c = S3Config::from_environment();
  EXPECT_EQ(c.credentials->where(), "web identity (role arn:aws:iam::1:role/p, token file /var/run/token) at http://127.0.0.1:9");
  env.set("AWS_ACCESS_KEY_ID", "AKENV");
  env.set("AWS_SECRET_ACCESS_KEY", "se");
  EXPECT_EQ(S3Config::from_environment().credentials->kind(), AwsCredentialSource::Kind::kFixed);
}

TEST(S3Config, AssumesAProfilesRoleWithItsSourceProfilesKeys) {
  testing::TempDir tmp;
  Env env;
  for (const char* n : kAwsVariables) env.unset(n);
  env.set("AWS_EC2_METADATA_DISABLED", "true");
  env.set("AWS_SHARED_CREDENTIALS_FILE", (tmp.path() / "credentials").string());
  env.set("AWS_CONFIG_FILE", (tmp.path() / "config").string());
  std::ofstream(tmp.path() / "credentials") << "[base]\naws_access_key_id = AKBASE\naws_secret_access_key = sb\n";
  std::ofstream(tmp.path() / "config")
      << "[profile cross]\nrole_arn = arn:aws:iam::2:role/reader\nsource_profile = base\nregion = eu-west-2\n"
         "aws_access_key_id = AKIGNORED\naws_secret_access_key = x\n"
         "[profile chain]\nrole_arn = arn:aws:iam::3:role/r\nsource_profile = cross\n"
         "[profile lonely]\nrole_arn = arn:aws:iam::4:role/r\n"
         "[profile instance]\nrole_arn = arn:aws:iam::5:role/r\ncredential_source = Ec2InstanceMetadata\n"
         "[profile nokeys]\nrole_arn = arn:aws:iam::6:role/r\nsource_profile = lonely2\n"
         "[profile sso]\nsso_session = corp\nsso_account_id = 1\n"
         "[profile process]\ncredential_process = /usr/bin/creds --json\n";
  env.set("AWS_PROFILE", "cross");
  const S3Config c = S3Config::from_environment();
  ASSERT_TRUE(c.credentials);
  EXPECT_EQ(c.credentials->kind(), AwsCredentialSource::Kind::kAssumedRole);  // before the profile's own keys
  EXPECT_EQ(c.credentials->where(), "the role arn:aws:iam::2:role/reader assumed with key AKBASE at "
                                    "https://sts.eu-west-2.amazonaws.com");
  const std::pair<const char*, const char*> refused[] = {
      {"chain", "role chains are not supported"},
      {"lonely", "has role_arn but neither source_profile nor web_identity_token_file"},
      {"instance", "credential_source, which is not supported"},
      {"nokeys", "names source_profile 'lonely2', which has no aws_access_key_id"},
      {"sso", "takes its credentials from sso_session, which tessel does not read"}};
  env.set("AWS_PROFILE", "process");
  const S3Config p = S3Config::from_environment();
  ASSERT_TRUE(p.credentials);
  EXPECT_EQ(p.credentials->kind(), AwsCredentialSource::Kind::kProcess);
  EXPECT_EQ(p.credentials->where(), "the credential_process of AWS profile 'process' (/usr/bin/creds --json)");
  for (const auto& [profile, message] : refused) {
    env.set("AWS_PROFILE", profile);
    EXPECT_THAT([] { S3Config::from_environment(); }, ::testing::ThrowsMessage<ValueError>(HasSubstr(message)))
        << profile;
  }
}

TEST(AwsCredentials, ReadsStsAnswers) {
  const std::string ok =
      "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
      "<AssumeRoleWithWebIdentityResult><Credentials><SessionToken>tok</SessionToken>"
      "<SecretAccessKey>secret</SecretAccessKey><Expiration>2026-12-03T23:00:23Z</Expiration>"
      "<AccessKeyId>ASIAKEY</AccessKeyId></Credentials></AssumeRoleWithWebIdentityResult>"
      "</AssumeRoleWithWebIdentityResponse>";
  const ExpiringCredentials c = parse_sts_credentials(ok, "sts");
  EXPECT_EQ(c.credentials.access_key, "ASIAKEY");
  EXPECT_EQ(c.credentials.secret_key, "secret");
  EXPECT_EQ(c.credentials.session_token, "tok");
  EXPECT_EQ(c.expires_at, parse_utc_time("2026-12-03T23:00:23Z"));
  EXPECT_THAT([] {
    parse_sts_credentials("<ErrorResponse><Error><Type>Sender</Type><Code>ExpiredTokenException</Code>"
                          "<Message>Token expired</Message></Error></ErrorResponse>", "sts");
  }, ::testing::ThrowsMessage<IoError>(HasSubstr("sts: ExpiredTokenException: Token expired")));
  EXPECT_EQ(parse_sts_credentials("<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>A</AccessKeyId>"
                                  "<SecretAccessKey>S</SecretAccessKey></Credentials></AssumeRoleResult>"
                                  "</AssumeRoleResponse>", "sts").credentials.access_key, "A");
  EXPECT_THAT([] { parse_sts_credentials("<a/>", "sts"); },
              ::testing::ThrowsMessage<IoError>(HasSubstr("no AccessKeyId and SecretAccessKey")));
  EXPECT_THAT([] { parse_sts_credentials("not xml <", "sts"); }, ::testing::ThrowsMessage<IoError>(HasSubstr("no XML")));
}

TEST(AwsCredentials, ReadsJsonAnswers) {
  const ExpiringCredentials c = parse_json_credentials(
      R"({"Code": "Success", "AccessKeyId": "ASIA1", "SecretAccessKey": "s", "Token": "t",
          "Expiration": "2026-12-03T16:00:00.123Z"})",
      "imds");
  EXPECT_EQ(c.credentials.access_key, "ASIA1");
  EXPECT_EQ(c.credentials.session_token, "t");
  EXPECT_EQ(c.expires_at, parse_utc_time("2026-12-03T16:00:00Z"));
  EXPECT_FALSE(parse_json_credentials(R"({"AccessKeyId": "A", "SecretAccessKey": "s"})", "c").expires_at);
  EXPECT_THAT([] { parse_json_credentials(R"({"Code": "AssumeRoleUnauthorizedAccess", "Message": "no"})", "imds"); },
              ::testing::ThrowsMessage<IoError>(HasSubstr("imds: the answer's Code is 'AssumeRoleUnauthorizedAccess': no")));
  EXPECT_THAT([] { parse_json_credentials(R"({"AccessKeyId": "A", "SecretAccessKey": "s", "Expiration": "soon"})", "c"); },
              ::testing::ThrowsMessage<IoError>(HasSubstr("c: the answer's Expiration 'soon' is no UTC time")));
  EXPECT_THAT([] { parse_json_credentials("[1]", "c"); }, ::testing::ThrowsMessage<IoError>(HasSubstr("no JSON object")));
}

TEST(AwsCredentials, ReadsACredentialProcesssOutput) {
  const ExpiringCredentials c = parse_process_credentials(
      R"({"Version": 1, "AccessKeyId": "ASIAP", "SecretAccessKey": "s", "SessionToken": "t",
          "Expiration": "2026-12-03T11:00:00Z"})",
      "p");
  EXPECT_EQ(c.credentials.access_key, "ASIAP");
  EXPECT_EQ(c.credentials.session_token, "t");
  EXPECT_EQ(c.expires_at, 1796295600);
  EXPECT_FALSE(parse_process_credentials(R"({"Version": 1, "AccessKeyId": "A", "SecretAccessKey": "s"})", "p").expires_at);
  EXPECT_THAT([] { parse_process_credentials(R"({"Version": 2, "AccessKeyId": "A", "SecretAccessKey": "s"})", "p"); },
              ::testing::ThrowsMessage<IoError>(HasSubstr("p: its output's Version is not 1")));
  EXPECT_THAT([] { parse_process_credentials("oops", "p"); }, ::testing::ThrowsMessage<IoError>(HasSubstr("no JSON object")));
  EXPECT_THAT([] { parse_process_credentials(R"({"Version": 1})", "p"); },
              ::testing::ThrowsMessage<IoError>(HasSubstr("no AccessKeyId and SecretAccessKey")));
}

TEST(AwsCredentials, RunsACredentialProcessAtEachFetch) {
  testing::TempDir tmp;
  const std::string script = (tmp.path() / "creds.sh").string();
  std::ofstream(script) << "#!/bin/sh\necho run >> " << (tmp.path() / "runs").string()
                        << "\necho '{\"Version\": 1, \"AccessKeyId\": \"ASIAPROC\", \"SecretAccessKey\": \"s\", "
                           "\"SessionToken\": \"t\"}'\n";
  auto source = AwsCredentialSource::process("sh " + script, "p");
  EXPECT_EQ(source->get().access_key, "ASIAPROC");
  EXPECT_EQ(source->get().session_token, "t");  // kept: no expiry given
  EXPECT_EQ(testing::read_file(tmp.path() / "runs"), "run\n");
  EXPECT_TRUE(source->renew_after_refusal("ASIAPROC"));
  EXPECT_EQ(source->get().access_key, "ASIAPROC");
  EXPECT_EQ(testing::read_file(tmp.path() / "runs"), "run\nrun\n");
  auto failing = AwsCredentialSource::process("echo nothing; exit 3", "p");
  EXPECT_THAT([&] { failing->get(); },
              ::testing::ThrowsMessage<IoError>(HasSubstr("credential_process of AWS profile 'p' (echo nothing; exit 3): "
                                                          "it exited with status 3")));
}

TEST(AwsCredentials, ReadsUtcTimes) {
  EXPECT_EQ(parse_utc_time("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(parse_utc_time("2026-12-03T11:00:00Z"), 1796295600);
  EXPECT_EQ(parse_utc_time("2026-12-03T11:00:00.999Z"), 1796295600);
  EXPECT_EQ(parse_utc_time("2026-12-03T11:00:00+00:00"), 1796295600);
  for (const char* bad : {"", "2026-12-03", "2026-12-03T11:00:00", "2026-12-03T11:00:00+01:00", "2026-13-03T11:00:00Z",
                          "2026-12-03T11:00:00.Z", " 2026-12-03T11:00:00Z", "2026-12-03T11:00:00Zx"})
    EXPECT_FALSE(parse_utc_time(bad)) << bad;
}

}  // namespace
}  // namespace tessel::detail
