#include "tessel/checkpoint/detail/io/gcs_auth.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessel/checkpoint/detail/io/http.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace {

constexpr const char* kScope = "https://www.googleapis.com/auth/devstorage.read_write";
constexpr const char* kGoogleTokenUri = "https://oauth2.googleapis.com/token";
constexpr const char* kMetadataTokenPath = "/computeMetadata/v1/instance/service-accounts/default/token";
constexpr int kTokenAttempts = 5;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// On Linux the DMI product name of a Google Cloud VM is "Google Compute Engine" (google-auth
// decides the same way before it asks the metadata server, so other machines never wait on it).
bool on_google_cloud() {
  const std::string name = read_text("/sys/class/dmi/id/product_name");
  return name.starts_with("Google");
}

std::string metadata_base() {
  std::string host = env("GCE_METADATA_HOST");
  if (host.empty()) host = env("GCE_METADATA_ROOT");
  if (host.empty()) {
    const std::string no_check = env("NO_GCE_CHECK");  // google-auth's switch for machines that are no VM
    if (no_check == "True" || no_check == "true" || no_check == "1") return "";
    return on_google_cloud() ? "http://169.254.169.254" : "";
  }
  if (!host.starts_with("http://") && !host.starts_with("https://")) host = "http://" + host;
  while (host.ends_with('/')) host.pop_back();
  return host;
}

std::string field(const nlohmann::json& j, const char* name, const std::string& path) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_string() || it->get<std::string>().empty())
    throw ValueError(fmt::format("the credentials file '{}' has no \"{}\"", path, name));
  return it->get<std::string>();
}

std::string form_encode(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out;
  for (const auto& [name, value] : fields) out += (out.empty() ? "" : "&") + name + "=" + uri_encode(value, false);
  return out;
}

std::string base64(const unsigned char* data, size_t n) {
  std::string out(4 * ((n + 2) / 3) + 1, '\0');
  const int m = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(n));
  out.resize(static_cast<size_t>(m));
  return out;
}

}  // namespace

std::string gcloud_adc_file() {
  std::string dir = env("CLOUDSDK_CONFIG");
  if (dir.empty() && !env("HOME").empty()) dir = env("HOME") + "/.config/gcloud";
  return dir.empty() ? std::string() : dir + "/application_default_credentials.json";
}

std::string base64url(std::string_view bytes) {
  std::string out = base64(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  while (!out.empty() && out.back() == '=') out.pop_back();
  for (char& c : out) {
    if (c == '+') c = '-';
    if (c == '/') c = '_';
  }
  return out;
}

std::string service_account_assertion(const std::string& client_email, const std::string& private_key_pem,
                                      const std::string& scope, const std::string& token_uri, int64_t now) {
  const nlohmann::json header = {{"alg", "RS256"}, {"typ", "JWT"}};
  const nlohmann::json claims = {
      {"iss", client_email}, {"scope", scope}, {"aud", token_uri}, {"iat", now}, {"exp", now + 3600}};
  const std::string signing_input = base64url(header.dump()) + "." + base64url(claims.dump());

  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(private_key_pem.data(), static_cast<int>(private_key_pem.size())),
                                               &BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr, &EVP_PKEY_free);
  if (!key) throw ValueError("the service account's private_key is not a PEM private key OpenSSL can read");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  size_t length = 0;
  const auto* input = reinterpret_cast<const unsigned char*>(signing_input.data());
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &length, input, signing_input.size()) != 1)
    throw ValueError("cannot sign with the service account's private_key (an RSA key is needed)");
  std::string signature(length, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &length, input,
                     signing_input.size()) != 1)
    throw ValueError("cannot sign with the service account's private_key");
  signature.resize(length);
  return signing_input + "." + base64url(signature);
}

GcsAuth GcsAuth::from_environment() {
  GcsAuth a;
  if (std::string token = env("GOOGLE_AUTH_TOKEN_FOR_TESTING"); !token.empty()) {
    a.source_ = Source::kFixedToken;
    a.token_ = token;
    a.refresh_at_ = std::chrono::steady_clock::time_point::max();
    a.hint_ = "GOOGLE_AUTH_TOKEN_FOR_TESTING";
    return a;
  }
  std::string path = env("GOOGLE_APPLICATION_CREDENTIALS");
  if (!path.empty() && !file_exists(path))
    throw ValueError(fmt::format("GOOGLE_APPLICATION_CREDENTIALS names '{}', which cannot be read", path));
  if (path.empty()) {
    const std::string adc = gcloud_adc_file();
    if (!adc.empty() && file_exists(adc)) path = adc;
  }
  if (!path.empty()) {
    const nlohmann::json j = nlohmann::json::parse(read_text(path), nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw ValueError(fmt::format("the credentials file '{}' is not a JSON object", path));
    const std::string type = j.value("type", std::string());
    a.hint_ = fmt::format("the {} credentials in '{}'", type, path);
    if (type == "service_account") {
      a.source_ = Source::kServiceAccount;
      a.client_email_ = field(j, "client_email", path);
      a.private_key_ = field(j, "private_key", path);
      a.token_uri_ = j.value("token_uri", std::string(kGoogleTokenUri));
    } else if (type == "authorized_user") {
      a.source_ = Source::kAuthorizedUser;
      a.client_id_ = field(j, "client_id", path);
      a.client_secret_ = field(j, "client_secret", path);
      a.refresh_token_ = field(j, "refresh_token", path);
      a.token_uri_ = j.value("token_uri", std::string(kGoogleTokenUri));
    } else {
      throw ValueError(fmt::format("the credentials file '{}' has type '{}'; service_account or authorized_user is "
                                   "supported", path, type));
    }
    return a;
  }
  if (std::string base = metadata_base(); !base.empty()) {
    a.source_ = Source::kMetadataServer;
    a.token_uri_ = base + kMetadataTokenPath;
    a.hint_ = "the metadata server at " + base;
    return a;
  }
  a.hint_ = "no credentials: GOOGLE_APPLICATION_CREDENTIALS is not set, there is no gcloud "
            "application_default_credentials.json, and this is no Google Cloud machine";
  return a;
}

GcsAuth::GcsAuth(const GcsAuth& other) { *this = other; }

GcsAuth& GcsAuth::operator=(const GcsAuth& other) {
  if (this == &other) return *this;
  std::scoped_lock lock(mu_, other.mu_);
  source_ = other.source_;
  hint_ = other.hint_;
  token_uri_ = other.token_uri_;
  client_email_ = other.client_email_;
  private_key_ = other.private_key_;
  client_id_ = other.client_id_;
  client_secret_ = other.client_secret_;
  refresh_token_ = other.refresh_token_;
  token_ = other.token_;
  refresh_at_ = other.refresh_at_;
  return *this;
}

std::string GcsAuth::authorization() const {
  if (source_ == Source::kNone) return {};
  std::lock_guard lock(mu_);
  if (token_.empty() || std::chrono::steady_clock::now() >= refresh_at_) fetch_token();
  return "Bearer " + token_;
}

bool GcsAuth::renew_after_refusal(const std::string& authorization) const {
  if (source_ == Source::kNone || source_ == Source::kFixedToken) return false;
  std::lock_guard lock(mu_);
  if ("Bearer " + token_ == authorization) token_.clear();
  return true;
}

void GcsAuth::fetch_token() const {
  HttpRequest request;
  std::string body;
  if (source_ == Source::kMetadataServer) {
    request = {"GET", token_uri_, {{"Metadata-Flavor", "Google"}}, {}};
    request.connect_timeout_s = 5;
  } else {
    if (source_ == Source::kServiceAccount) {
      body = form_encode({{"grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"},
                          {"assertion", service_account_assertion(client_email_, private_key_, kScope, token_uri_,
                                                                  static_cast<int64_t>(std::time(nullptr)))}});
    } else {
      body = form_encode({{"grant_type", "refresh_token"},
                          {"client_id", client_id_},
                          {"client_secret", client_secret_},
                          {"refresh_token", refresh_token_}});
    }
    request = {"POST", token_uri_, {{"content-type", "application/x-www-form-urlencoded"}},
               std::as_bytes(std::span(body.data(), body.size()))};
  }
  request.total_timeout_s = 60;
  const std::string what = fmt::format("getting a GCS access token from {} for {}", token_uri_, hint_);
  HttpResponse response;
  for (int attempt = 1;; ++attempt) {
    try {
      response = http_send(request);
    } catch (const HttpTransportError& e) {
      if (attempt >= kTokenAttempts) throw IoError(fmt::format("{}: {}", what, e.what()));
      back_off(attempt);
      continue;
    }
    if ((response.status >= 500 || response.status == 429) && attempt < kTokenAttempts) {
      back_off(attempt);
      continue;
    }
    break;
  }
  if (response.status != 200)
    throw IoError(fmt::format("{}: HTTP {}: {}", what, response.status, response.body.substr(0, 300)));
  const nlohmann::json j = nlohmann::json::parse(response.body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("access_token") || !j["access_token"].is_string())
    throw IoError(what + ": the answer has no access_token");
  token_ = j["access_token"].get<std::string>();
  int64_t seconds = 3600;
  if (auto it = j.find("expires_in"); it != j.end() && it->is_number_integer()) seconds = it->get<int64_t>();
  // Renewed five minutes before it expires (halfway through a shorter life).
  refresh_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(seconds - std::min<int64_t>(300, seconds / 2));
}

}  // namespace tessel::detail
