#include "tessel/core/dtype.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;

TEST(DType, NamesSizesAndTypestrsMatchNumpyAndTensorStore) {
  EXPECT_EQ(name(DType::kF32), "float32");
  EXPECT_EQ(short_name(DType::kBF16), "bf16");
  EXPECT_EQ(item_size(DType::kBool), 1u);
  EXPECT_EQ(item_size(DType::kF16), 2u);
  EXPECT_EQ(item_size(DType::kI64), 8u);
  EXPECT_EQ(numpy_typestr(DType::kI32), "<i4");
  EXPECT_EQ(numpy_typestr(DType::kBool), "|b1");
  EXPECT_EQ(numpy_typestr(DType::kU8), "|u1");
  EXPECT_EQ(numpy_typestr(DType::kBF16), "bfloat16");  // TensorStore: no numpy code for bf16
  EXPECT_EQ(zarr3_data_type(DType::kF64), "float64");
  EXPECT_TRUE(is_floating(DType::kBF16));
  EXPECT_FALSE(is_floating(DType::kI8));
}

TEST(DType, EverySpellingParsesBack) {
  EXPECT_EQ(all_dtypes().size(), 15u);
  for (DType t : all_dtypes()) {
    EXPECT_EQ(parse_dtype(name(t)), t);
    EXPECT_EQ(parse_dtype(short_name(t)), t);
    EXPECT_EQ(parse_dtype(numpy_typestr(t)), t);
    EXPECT_EQ(parse_dtype(zarr3_data_type(t)), t);
  }
  EXPECT_EQ(parse_dtype("=f4"), DType::kF32);
  EXPECT_EQ(parse_dtype("<u1"), DType::kU8);
  EXPECT_EQ(parse_dtype(">u1"), DType::kU8);  // byte order is moot for one byte
}

TEST(DType, RejectsUnknownAndBigEndian) {
  EXPECT_THAT([] { parse_dtype("float128"); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("unknown dtype 'float128'")));
  EXPECT_THAT([] { parse_dtype(">f4"); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("big-endian")));
  EXPECT_THROW(parse_dtype(""), ValueError);
}

}  // namespace
}  // namespace tessel
