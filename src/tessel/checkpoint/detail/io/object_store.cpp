#include "tessel/checkpoint/detail/io/object_store.h"

#include "tessel/checkpoint/detail/io/gcs.h"
#include "tessel/checkpoint/detail/io/s3.h"
#include "tessel/core/error.h"
#include "tessel/core/location.h"

namespace tessel::detail {

std::shared_ptr<const ObjectStore> ObjectStore::for_location(const Location& loc) {
  try {
    switch (loc.kind()) {
      case Location::Kind::kS3:
        return S3Client::current();
      case Location::Kind::kGcs:
        return GcsClient::current();
      case Location::Kind::kLocal:
        break;
    }
  } catch (const ValueError& e) {  // a bad endpoint or credentials file: named with the location it stops
    throw ValueError("'" + loc.string() + "': " + e.what());
  }
  throw ValueError("'" + loc.string() + "' is a local path, not a bucket");
}

void append_page(ObjectListing& out, ObjectListing page, const std::string& prefix, const std::string& where) {
  for (auto& o : page.objects) {
    if (!o.first.starts_with(prefix)) throw IoError(where + ": the server listed '" + o.first + "'");
    out.objects.push_back(std::move(o));
  }
  for (auto& p : page.prefixes) {
    if (!p.starts_with(prefix)) throw IoError(where + ": the server listed '" + p + "'");
    out.prefixes.push_back(std::move(p));
  }
}

void ObjectStore::remove_all(const std::string& bucket, const std::string& prefix) const {
  for (const auto& [key, size] : list(bucket, prefix, "").objects) remove(bucket, key);
}

}  // namespace tessel::detail
