#include "tessel/runtime/cast.h"

#include <bit>
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "runtime/runtime_test_util.h"
#include "tessel/core/half.h"

namespace tessel {
namespace {

const NamedSharding kRows(Mesh::parse("d=4"), {{"d"}});

TEST(Cast, F32ToBf16AndF16RoundToNearestEvenOnEveryShard) {
  auto rt = Runtime::host(4);
  std::vector<float> v = {1.0f, -2.5f, 3.14159f, 65520.0f, 1e-7f, -0.0f, INFINITY, NAN,
                          std::bit_cast<float>(0x3F808000u), std::bit_cast<float>(0x3F818000u),
                          1e30f, -6.1e-5f};
  Array x = device_put(rt, HostArray::from<float>(Shape{12}, std::span<const float>(v)), kRows, "w");
  Array b = cast(x, DType::kBF16);
  Array h = cast(x, DType::kF16);
  EXPECT_EQ(b.dtype(), DType::kBF16);
  EXPECT_EQ(b.sharding(), x.sharding());
  EXPECT_EQ(b.label(), "w");
  HostArray bv_host = to_host(b);
  auto bv = bv_host.values<uint16_t>();
  HostArray hv_host = to_host(h);
  auto hv = hv_host.values<uint16_t>();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(bv[i], f32_to_bf16(v[i])) << i;
    EXPECT_EQ(hv[i], f32_to_f16(v[i])) << i;
  }
  // And back: exact widening.
  HostArray back_host = to_host(cast(b, DType::kF32));
  auto back = back_host.values<float>();
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isnan(v[i])) EXPECT_EQ(back[i], bf16_to_f32(f32_to_bf16(v[i]))) << i;
  EXPECT_TRUE(std::isnan(back[7]));
  HostArray back16_host = to_host(cast(h, DType::kF32));
  auto back16 = back16_host.values<float>();
  EXPECT_EQ(back16[3], INFINITY);
  EXPECT_EQ(back16[1], -2.5f);
  testing::expect_accounts_match(rt, {&x, &b, &h});
}

TEST(Cast, F64ToBf16RoundsOnce) {
  // 1 + 2^-8 + 2^-30 lies just above the bf16 midpoint 1 + 2^-8: correct rounding goes up,
  // rounding through f32 first would land on the midpoint and tie down to 1.0.
  auto rt = Runtime::host(4);
  double d = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  Array x = device_put(rt, HostArray::from<double>(Shape{4}, {d, -d, 1.0, 0.0}), kRows);
  HostArray out_host = to_host(cast(x, DType::kBF16));
  auto out = out_host.values<uint16_t>();
  EXPECT_EQ(out[0], 0x3F81);
  EXPECT_EQ(out[1], 0xBF81);
  EXPECT_EQ(out[2], 0x3F80);
}

TEST(Cast, IntegersBoolsAndSaturation) {
  auto rt = Runtime::host(4);
  std::vector<float> v = {-1.7f, 2.9f, 3e10f, -3e10f, NAN, 0.0f, 255.5f, 300.0f};
  Array x = device_put(rt, HostArray::from<float>(Shape{8}, std::span<const float>(v)), kRows);
  HostArray i32_host = to_host(cast(x, DType::kI32));
  auto i32 = i32_host.values<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(i32.begin(), i32.end()),
            (std::vector<int32_t>{-1, 2, std::numeric_limits<int32_t>::max(),
                                  std::numeric_limits<int32_t>::min(), 0, 0, 255, 300}));
  HostArray u8_host = to_host(cast(x, DType::kU8));
  auto u8 = u8_host.values<uint8_t>();
  EXPECT_EQ(u8[0], 0);  // saturates at 0
  EXPECT_EQ(u8[7], 255);
  HostArray flags_host = to_host(cast(x, DType::kBool));
  auto flags = flags_host.values<uint8_t>();
  EXPECT_EQ(std::vector<uint8_t>(flags.begin(), flags.end()), (std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 1, 1}));
  Array ints = device_put(rt, HostArray::from<int64_t>(Shape{4}, {300, -1, 1 << 20, 7}), kRows);
  HostArray wrapped_host = to_host(cast(ints, DType::kU8));
  auto wrapped = wrapped_host.values<uint8_t>();
  EXPECT_EQ(std::vector<uint8_t>(wrapped.begin(), wrapped.end()), (std::vector<uint8_t>{44, 255, 0, 7}));
  HostArray f_host = to_host(cast(ints, DType::kF32));
  auto f = f_host.values<float>();
  EXPECT_EQ(f[2], 1048576.0f);
  EXPECT_TRUE(cast(ints, DType::kI64).shard(1).buffer.shares_with(ints.shard(1).buffer));
}

}  // namespace
}  // namespace tessel
