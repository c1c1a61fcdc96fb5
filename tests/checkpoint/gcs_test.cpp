// The GCS client's pieces that need no server: listing pages, GCS's CRC-32C encoding, the
// configuration and credentials taken from the environment, and the service account's JWT
// (verified here with the key's public half). The requests themselves run against the GCS
// emulator in tests/python/test_gcs.py.
#include "tessel/checkpoint/detail/io/gcs.h"

#include <openssl/evp.h>
#include <openssl/pem.h>

#include <fstream>
#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "test_util.h"

namespace tessel::detail {
namespace {
using ::testing::HasSubstr;

TEST(GcsCrc32c, EncodesTheBigEndianChecksumInBase64) {
  EXPECT_EQ(gcs_crc32c_base64(0), "AAAAAA==");
  EXPECT_EQ(gcs_crc32c_base64(0xE3069283), "4waSgw==");  // CRC-32C("123456789"), RFC 3720's check value
  EXPECT_EQ(base64url("\xfb\xff"), "-_8");
  EXPECT_EQ(base64url("ab"), "YWI");
}

TEST(GcsListPage, ReadsObjectsPrefixesAndTheNextToken) {
  std::string next;
  const ObjectListing l = parse_gcs_list_page(
      R"({"kind": "storage#objects", "items": [{"name": "run/a", "size": "12"}, {"name": "run/b", "size": "0"}],
          "prefixes": ["run/1/", "run/2/"], "nextPageToken": "tok"})",
      "listing", &next);
  ASSERT_EQ(l.objects.size(), 2u);
  EXPECT_EQ(l.objects[0], (std::pair<std::string, int64_t>("run/a", 12)));
  EXPECT_EQ(l.objects[1].second, 0);
  EXPECT_EQ(l.prefixes, (std::vector<std::string>{"run/1/", "run/2/"}));
  EXPECT_EQ(next, "tok");
  EXPECT_TRUE(parse_gcs_list_page(R"({"kind": "storage#objects"})", "listing", &next).objects.empty());
  EXPECT_EQ(next, "");
}

TEST(GcsListPage, RefusesWhatIsNoListing) {
  std::string next;
  for (const char* body : {"", "<xml/>", "[]", R"({"items": {}})", R"({"items": [{"size": "1"}]})",
                           R"({"items": [{"name": "a"}]})", R"({"items": [{"name": "a", "size": "-1"}]})",
                           R"({"items": [{"name": "a", "size": "1e3"}]})", R"({"prefixes": [1]})",
                           R"({"nextPageToken": 5})"}) {
    SCOPED_TRACE(body);
    EXPECT_THROW((void)parse_gcs_list_page(body, "listing gs://b/p", &next), IoError);
  }
}

class GcsEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING",
                             "GOOGLE_APPLICATION_CREDENTIALS", "GCE_METADATA_HOST", "GCE_METADATA_ROOT",
                             "TESSEL_GCS_MAX_ATTEMPTS"})
      env_.unset(name);
    env_.set("CLOUDSDK_CONFIG", (dir_.path() / "gcloud").string());
    env_.set("NO_GCE_CHECK", "True");
  }
  std::string write(const std::string& name, const nlohmann::json& doc) {
    const auto path = dir_.path() / name;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << doc.dump();
    return path.string();
  }
  testing::ScopedEnv env_;
  testing::TempDir dir_;
};

TEST_F(GcsEnv, EndpointsFromTheEmulatorVariables) {
  GcsConfig c = GcsConfig::from_environment();
  EXPECT_EQ(c.endpoint, "https://storage.googleapis.com");
  EXPECT_EQ(c.auth.source(), GcsAuth::Source::kNone);
  EXPECT_THAT(c.auth.hint(), HasSubstr("GOOGLE_APPLICATION_CREDENTIALS is not set"));
  EXPECT_EQ(c.auth.authorization(), "");

  env_.set("TENSORSTORE_GCS_HTTP_URL", "http://127.0.0.1:4443/");
  env_.set("GOOGLE_AUTH_TOKEN_FOR_TESTING", "fixed");
  env_.set("TESSEL_GCS_MAX_ATTEMPTS", "3");
  c = GcsConfig::from_environment();
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:4443");
  EXPECT_EQ(c.max_attempts, 3);
  EXPECT_EQ(c.auth.source(), GcsAuth::Source::kFixedToken);
  EXPECT_EQ(c.auth.authorization(), "Bearer fixed");
  // A fixed token cannot be renewed: a 401 to it is the answer; nor can no credentials.
  EXPECT_FALSE(c.auth.renew_after_refusal("Bearer fixed"));
  EXPECT_EQ(c.auth.authorization(), "Bearer fixed");
  EXPECT_FALSE(GcsAuth::none("an emulator").renew_after_refusal(""));

  // An emulator named by host:port: plain HTTP, no credentials whatever else is set.
  env_.set("STORAGE_EMULATOR_HOST", "localhost:9023");
  c = GcsConfig::from_environment();
  EXPECT_EQ(c.endpoint, "http://localhost:9023");
  EXPECT_EQ(c.auth.source(), GcsAuth::Source::kNone);

  env_.set("STORAGE_EMULATOR_HOST", "ftp://localhost:9023");
  EXPECT_THROW((void)GcsConfig::from_environment(), ValueError);
}

TEST_F(GcsEnv, CredentialsInGooglesOrder) {
  const std::string sa = write("sa.json", {{"type", "service_account"},
                                           {"client_email", "a@p.iam.gserviceaccount.com"},
                                           {"private_key", "-----BEGIN PRIVATE KEY-----"},
                                           {"token_uri", "http://127.0.0.1:1/token"}});
  write("gcloud/application_default_credentials.json",
        {{"type", "authorized_user"}, {"client_id", "c"}, {"client_secret", "s"}, {"refresh_token", "r"}});
  env_.set("GOOGLE_APPLICATION_CREDENTIALS", sa);
  GcsAuth a = GcsAuth::from_environment();
  EXPECT_EQ(a.source(), GcsAuth::Source::kServiceAccount);
  EXPECT_THAT(a.hint(), HasSubstr("service_account credentials in '" + sa + "'"));

  env_.unset("GOOGLE_APPLICATION_CREDENTIALS");
  a = GcsAuth::from_environment();
  EXPECT_EQ(a.source(), GcsAuth::Source::kAuthorizedUser);
  EXPECT_THAT(a.hint(), HasSubstr("application_default_credentials.json"));

  std::filesystem::remove(dir_.path() / "gcloud" / "application_default_credentials.json");
  env_.set("GCE_METADATA_HOST", "127.0.0.1:8080");
  a = GcsAuth::from_environment();
  EXPECT_EQ(a.source(), GcsAuth::Source::kMetadataServer);
  EXPECT_EQ(a.hint(), "the metadata server at http://127.0.0.1:8080");
  EXPECT_TRUE(a.renew_after_refusal("Bearer some-token"));  // the metadata server mints new ones
}

TEST_F(GcsEnv, BadCredentialsFilesAreNamed) {
  const auto refused = [&](const nlohmann::json& doc, const std::string& message) {
    env_.set("GOOGLE_APPLICATION_CREDENTIALS", write("c.json", doc));
    try {
      (void)GcsAuth::from_environment();
      ADD_FAILURE() << "accepted " << doc.dump();
    } catch (const ValueError& e) {
      EXPECT_THAT(e.what(), HasSubstr(message));
    }
  };
  refused({{"type", "impersonated_service_account"}},
          "has type 'impersonated_service_account'; service_account, authorized_user or external_account");
  refused({{"type", "external_account"}, {"audience", "a"}}, "has no \"subject_token_type\"");
  refused({{"type", "external_account"}, {"audience", "a"}, {"subject_token_type", "t"}, {"token_url", "ftp://x"},
           {"credential_source", {{"file", "/t"}}}},
          "token_url and service_account_impersonation_url must be http(s) URLs");
  refused({{"type", "external_account"}, {"audience", "a"}, {"subject_token_type", "t"}, {"token_url", "https://s"},
           {"credential_source", {{"url", "https://x"}, {"headers", {{"h", "a\r\nb"}}}}}},
          "header 'h' is no one-line string");
  refused({{"type", "service_account"}, {"client_email", "a@b"}}, "has no \"private_key\"");
  refused({{"type", "authorized_user"}, {"client_id", "c"}, {"client_secret", "s"}}, "has no \"refresh_token\"");
  refused(nlohmann::json::array(), "is not a JSON object");
  env_.set("GOOGLE_APPLICATION_CREDENTIALS", (dir_.path() / "missing.json").string());
  EXPECT_THROW((void)GcsAuth::from_environment(), ValueError);
}

std::string unbase64url(std::string s) {
  for (char& c : s) c = c == '-' ? '+' : c == '_' ? '/' : c;
  while (s.size() % 4) s += '=';
  std::string out(s.size(), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(static_cast<size_t>(n) - (s.ends_with("==") ? 2 : s.ends_with("=") ? 1 : 0));
  return out;
}

TEST(ServiceAccountAssertion, IsAnRs256JwtTheKeyVerifies) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_RSA_gen(2048), &EVP_PKEY_free);
  ASSERT_TRUE(key);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  ASSERT_EQ(PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr), 1);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  const std::string pem(data, static_cast<size_t>(size));

  const std::string jwt = service_account_assertion("a@p.iam.gserviceaccount.com", pem, "scope-x",
                                                    "https://oauth2.googleapis.com/token", 1700000000);
  const size_t dot1 = jwt.find('.'), dot2 = jwt.rfind('.');
  ASSERT_NE(dot1, dot2);
  EXPECT_EQ(nlohmann::json::parse(unbase64url(jwt.substr(0, dot1))), (nlohmann::json{{"alg", "RS256"}, {"typ", "JWT"}}));
  const auto claims = nlohmann::json::parse(unbase64url(jwt.substr(dot1 + 1, dot2 - dot1 - 1)));
  EXPECT_EQ(claims, (nlohmann::json{{"iss", "a@p.iam.gserviceaccount.com"},
                                    {"scope", "scope-x"},
                                    {"aud", "https://oauth2.googleapis.com/token"},
                                    {"iat", 1700000000},
                                    {"exp", 1700003600}}));
  const std::string signature = unbase64url(jwt.substr(dot2 + 1));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  ASSERT_EQ(EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key.get()), 1);
  const std::string input = jwt.substr(0, dot2);
  EXPECT_EQ(EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                             reinterpret_cast<const unsigned char*>(input.data()), input.size()),
            1);
  EXPECT_THROW((void)service_account_assertion("a@b", "not a key", "s", "u", 0), ValueError);
}

}  // namespace
}  // namespace tessel::detail
