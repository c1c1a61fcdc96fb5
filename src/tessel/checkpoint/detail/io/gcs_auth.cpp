#include "tessel/checkpoint/detail/io/gcs_auth.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <algorithm>
#include <cctype>
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
#include "tessel/detail/json_util.h"

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

bool is_web_url(const std::string& url) { return url.starts_with("https://") || url.starts_with("http://"); }

// An external_account file's settings (workload identity federation), checked.
GcsExternalAccount external_settings(const nlohmann::json& j, const std::string& path) {
  GcsExternalAccount e;
  e.audience = field(j, "audience", path);
  e.subject_token_type = field(j, "subject_token_type", path);
  e.impersonation_url = json_util::string_member(j, "service_account_impersonation_url");
  if (!is_web_url(field(j, "token_url", path)) || (!e.impersonation_url.empty() && !is_web_url(e.impersonation_url)))
    throw ValueError(fmt::format("the credentials file '{}': token_url and service_account_impersonation_url must be "
                                 "http(s) URLs", path));
  auto source = j.find("credential_source");
  if (source == j.end() || !source->is_object())
    throw ValueError(fmt::format("the credentials file '{}' has no \"credential_source\" object", path));
  for (const char* unsupported : {"environment_id", "executable"}) {
    if (source->contains(unsupported))
      throw ValueError(fmt::format("the credentials file '{}' takes its subject token from \"{}\" (AWS or an "
                                   "executable), which tessel does not read; a file or a URL is supported",
                                   path, unsupported));
  }
  e.file = json_util::string_member(*source, "file");
  e.url = json_util::string_member(*source, "url");
  if (e.file.empty() == e.url.empty())
    throw ValueError(fmt::format("the credentials file '{}': credential_source needs one of \"file\" and \"url\"", path));
  if (!e.url.empty() && !is_web_url(e.url))
    throw ValueError(fmt::format("the credentials file '{}': credential_source's url '{}' is no http(s) URL", path, e.url));
  if (auto headers = source->find("headers"); headers != source->end() && headers->is_object()) {
    for (const auto& [name, value] : headers->items()) {
      if (!value.is_string() || value.get<std::string>().find_first_of("\r\n") != std::string::npos)
        throw ValueError(fmt::format("the credentials file '{}': header '{}' is no one-line string", path, name));
      e.headers.emplace_back(name, value.get<std::string>());
    }
  }
  if (auto format = source->find("format"); format != source->end() && format->is_object()) {
    e.format = format->value("type", std::string("text"));
    e.field = json_util::string_member(*format, "subject_token_field_name");
    if (e.format != "text" && e.format != "json")
      throw ValueError(fmt::format("the credentials file '{}': format type '{}' (text or json)", path, e.format));
    if (e.format == "json" && e.field.empty())
      throw ValueError(fmt::format("the credentials file '{}': a json format needs subject_token_field_name", path));
  }
  return e;
}

// The JSON answer of a token service to `request`, tried again on a dropped connection, a 5xx or a
// 429; `what` names it in errors.
nlohmann::json token_answer(const HttpRequest& request, const std::string& what) {
  const HttpResponse response = http_send_retried(request, kTokenAttempts, what);
  if (response.status != 200)
    throw IoError(fmt::format("{}: HTTP {}: {}", what, response.status, response.body.substr(0, 300)));
  nlohmann::json j = nlohmann::json::parse(response.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw IoError(what + ": the answer is no JSON object");
  return j;
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
    } else if (type == "external_account") {
      a.source_ = Source::kExternalAccount;
      a.external_ = external_settings(j, path);
      a.token_uri_ = field(j, "token_url", path);
    } else {
      throw ValueError(fmt::format("the credentials file '{}' has type '{}'; service_account, authorized_user or "
                                   "external_account is supported", path, type));
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
  external_ = other.external_;
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
  if (source_ == Source::kExternalAccount) {
    auto [token, seconds] = external_token();
    token_ = std::move(token);
    refresh_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(seconds - std::min<int64_t>(300, seconds / 2));
    return;
  }
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
  const nlohmann::json j =
      token_answer(request, fmt::format("getting a GCS access token from {} for {}", token_uri_, hint_));
  if (!j.contains("access_token") || !j["access_token"].is_string())
    throw IoError(fmt::format("getting a GCS access token from {} for {}: the answer has no access_token", token_uri_, hint_));
  token_ = j["access_token"].get<std::string>();
  int64_t seconds = 3600;
  if (auto it = j.find("expires_in"); it != j.end() && it->is_number_integer()) seconds = it->get<int64_t>();
  // Renewed five minutes before it expires (halfway through a shorter life).
  refresh_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(seconds - std::min<int64_t>(300, seconds / 2));
}


std::pair<std::string, int64_t> GcsAuth::external_token() const {
  const GcsExternalAccount& e = external_;
  // The subject token: the platform's (a Kubernetes service account's, an OIDC provider's).
  std::string subject;
  if (!e.file.empty()) {
    std::ifstream in(e.file, std::ios::binary);
    if (!in) throw IoError(fmt::format("getting a GCS access token for {}: cannot read the subject token file '{}'", hint_, e.file));
    std::ostringstream text;
    text << in.rdbuf();
    subject = text.str();
  } else {
    HttpRequest request{"GET", e.url, e.headers, {}};
    request.total_timeout_s = 60;
    const std::string what = fmt::format("getting the subject token from {} for {}", e.url, hint_);
    HttpResponse r = http_send(request);
    if (r.status != 200) throw IoError(fmt::format("{}: HTTP {}: {}", what, r.status, r.body.substr(0, 300)));
    subject = std::move(r.body);
  }
  if (e.format == "json") {
    const nlohmann::json j = nlohmann::json::parse(subject, nullptr, false);
    subject = j.is_object() ? json_util::string_member(j, e.field.c_str()) : std::string();
    if (subject.empty()) throw IoError(fmt::format("the subject token for {} has no string \"{}\"", hint_, e.field));
  }
  while (!subject.empty() && std::isspace(static_cast<unsigned char>(subject.back()))) subject.pop_back();
  if (subject.empty()) throw IoError(fmt::format("the subject token for {} is empty", hint_));

  // Google's STS: the subject token for a federated access token (RFC 8693 token exchange).
  const std::string body = form_encode({{"grant_type", "urn:ietf:params:oauth:grant-type:token-exchange"},
                                        {"audience", e.audience},
                                        {"scope", kScope},
                                        {"requested_token_type", "urn:ietf:params:oauth:token-type:access_token"},
                                        {"subject_token", subject},
                                        {"subject_token_type", e.subject_token_type}});
  HttpRequest exchange{"POST", token_uri_, {{"content-type", "application/x-www-form-urlencoded"}},
                       std::as_bytes(std::span(body.data(), body.size()))};
  exchange.total_timeout_s = 60;
  const nlohmann::json sts = token_answer(exchange, fmt::format("exchanging the subject token at {} for {}", token_uri_, hint_));
  std::string token = json_util::string_member(sts, "access_token");
  if (token.empty()) throw IoError(fmt::format("{}: the answer has no access_token", token_uri_));
  int64_t seconds = 3600;
  if (auto it = sts.find("expires_in"); it != sts.end() && it->is_number_integer()) seconds = it->get<int64_t>();
  if (e.impersonation_url.empty()) return {token, seconds};

  // The service account's own token, asked for with the federated one.
  const std::string json_body = nlohmann::json{{"scope", {kScope}}, {"lifetime", "3600s"}}.dump();
  HttpRequest impersonate{"POST", e.impersonation_url,
                          {{"content-type", "application/json"}, {"authorization", "Bearer " + token}},
                          std::as_bytes(std::span(json_body.data(), json_body.size()))};
  impersonate.total_timeout_s = 60;
  const std::string what = fmt::format("impersonating at {} for {}", e.impersonation_url, hint_);
  const nlohmann::json sa = token_answer(impersonate, what);
  token = json_util::string_member(sa, "accessToken");
  const std::optional<int64_t> expires = parse_utc_time(json_util::string_member(sa, "expireTime"));
  if (token.empty() || !expires) throw IoError(what + ": the answer has no accessToken and expireTime");
  return {token, std::max<int64_t>(0, *expires - static_cast<int64_t>(std::time(nullptr)))};
}

}  // namespace tessel::detail
