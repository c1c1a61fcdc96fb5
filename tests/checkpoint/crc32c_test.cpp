#include "tessel/checkpoint/detail/io/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace tessel {
namespace {

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

TEST(Crc32c, KnownValues) {
  // RFC 3720 (iSCSI) B.4 and the common check value of the Castagnoli CRC.
  EXPECT_EQ(detail::crc32c(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(detail::crc32c(bytes_of(std::string(32, '\0'))), 0x8A9136AAu);
  EXPECT_EQ(detail::crc32c(bytes_of(std::string(32, '\xff'))), 0x62A8AB43u);
  EXPECT_EQ(detail::crc32c({}), 0u);
}

// The three-stream path joins its streams with a zero-append operator: every length around the
// stretch boundaries, at unaligned starts, and extended in pieces, gives the bytewise value.
TEST(Crc32c, FastPathEqualsBytewise) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<std::byte> data(200000 + 16);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  std::vector<size_t> lengths = {0, 1, 7, 8, 9, 24575, 24576, 24577, 49152, 49159, 73728 + 3, 200000};
  for (int i = 0; i < 40; ++i) lengths.push_back(rng() % 200000);
  for (size_t n : lengths) {
    const size_t start = rng() % 16;
    const auto span = std::span<const std::byte>(data).subspan(start, n);
    const uint32_t want = detail::crc32c_bytewise(span);
    EXPECT_EQ(detail::crc32c(span), want) << "length " << n << " at offset " << start;
    const size_t cut = n == 0 ? 0 : rng() % n;
    EXPECT_EQ(detail::crc32c(span.subspan(cut), detail::crc32c(span.first(cut))), want) << "length " << n << " cut at " << cut;
  }
}

}  // namespace
}  // namespace tessel
