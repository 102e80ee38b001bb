// Every validation rule of the safetensors format, each with a malformed file made here, and
// each error naming the file and, where one is at fault, the tensor.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/test_util.h"
#include "core/error.h"
#include "core/half.h"
#include "loader/safetensors.h"

namespace atom::test {
namespace {

// A raw file: 8-byte little-endian header length, the header text as given, then `data`.
std::string raw_file(const std::string& header, const std::string& data,
                     int64_t len_override = -1) {
  std::string s(8, '\0');
  uint64_t n = len_override >= 0 ? static_cast<uint64_t>(len_override) : header.size();
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s + header + data;
}

class Safetensors : public ::testing::Test {
 protected:
  TempDir dir;
  std::string path = dir.file("t.safetensors");
  void put(const std::string& bytes) { write_file(path, bytes); }
};

TEST_F(Safetensors, RoundTripThroughMmapAndPlainReads) {
  Tensor a = Tensor::empty({2, 3}, DType::kF32);
  for (int i = 0; i < 6; ++i) a.ptr<float>()[i] = 0.5f * i;
  Tensor b = Tensor::empty({4}, DType::kBF16);
  for (int i = 0; i < 4; ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(1.0f + i);
  Tensor empty = Tensor::empty({0, 5}, DType::kF16);
  Tensor scalar = Tensor::empty({}, DType::kI64);
  scalar.ptr<int64_t>()[0] = -7;
  safetensors_write(path, {{"a", a}, {"b", b}, {"empty", empty}, {"scalar", scalar}},
                    {{"format", "pt"}});
  for (bool mmap : {true, false}) {
    SafetensorsFile f(path, mmap);
    EXPECT_EQ(f.header().metadata.at("format"), "pt");
    ASSERT_EQ(f.header().entries.size(), 4u);
    Tensor ra = f.tensor("a");
    EXPECT_EQ(ra.shape(), (Shape{2, 3}));
    EXPECT_EQ(ra.ptr<float>()[5], 2.5f);
    EXPECT_EQ(bf16_to_f32(f.tensor("b").ptr<uint16_t>()[3]), 4.0f);
    EXPECT_EQ(f.tensor("empty").numel(), 0);
    EXPECT_EQ(f.tensor("scalar").ptr<int64_t>()[0], -7);
    EXPECT_ERROR_CONTAINS(f.tensor("nope"), path, "'nope'");
  }
  const SafetensorsHeader h = safetensors_read_header(path);
  EXPECT_EQ(h.entries.size(), 4u);
}

TEST_F(Safetensors, FileSmallerThanTheLengthField) {
  put("abc");
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "8-byte");
  EXPECT_ERROR_CONTAINS(SafetensorsFile(path, true), path, "8-byte");
}

TEST_F(Safetensors, HeaderOverTheSizeCap) {
  put(raw_file("{}", "", 100'000'001));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "exceeds the limit");
}

TEST_F(Safetensors, HeaderRunsPastTheEndOfATruncatedFile) {
  put(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "", 500));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "runs past the end");
}

TEST_F(Safetensors, HeaderNotJson) {
  put(raw_file("{not json", ""));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "not valid JSON");
  put(raw_file("[1, 2]  ", ""));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'{'");
}

TEST_F(Safetensors, UnknownDtypeNamesTheTensor) {
  put(raw_file(R"({"w":{"dtype":"F12","shape":[1],"data_offsets":[0,2]}})", "xx"));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'w'", "unknown dtype 'F12'");
}

TEST_F(Safetensors, OverlappingOffsets) {
  put(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               std::string(12, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'b'", "invalid data_offsets");
}

TEST_F(Safetensors, GapBetweenTensors) {
  put(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
               std::string(12, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'b'", "contiguous");
}

TEST_F(Safetensors, FirstTensorMustStartAtZero) {
  put(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'a'", "invalid data_offsets");
}

TEST_F(Safetensors, ByteSizeMustEqualShapeTimesDtype) {
  put(raw_file(R"({"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,10]}})",
               std::string(10, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'w'", "needs 12");
}

TEST_F(Safetensors, SubByteTensorsMustFillWholeBytes) {
  put(raw_file(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", std::string(2, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'w'", "whole bytes");
  put(raw_file(R"({"w":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", std::string(2, '\0')));
  EXPECT_NO_THROW(safetensors_read_header(path));
}

TEST_F(Safetensors, ShapeOverflow) {
  put(raw_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
               std::string(4, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'w'", "overflows");
}

TEST_F(Safetensors, TruncatedData) {
  put(raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
               std::string(12, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'w'", "run past the 12 data bytes");
  EXPECT_ERROR_CONTAINS(SafetensorsFile(path, false), path, "'w'", "run past the 12 data bytes");
}

TEST_F(Safetensors, TrailingBytesAfterTheLastTensor) {
  put(raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(9, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "truncated or trailing");
}

TEST_F(Safetensors, MalformedEntries) {
  put(raw_file(R"({"w":{"dtype":"F32","shape":[1]}})", ""));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), "'w'", "data_offsets");
  put(raw_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), "'w'", "shape");
  put(raw_file(R"({"__metadata__":{"k":1}})", ""));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), "__metadata__");
}

TEST_F(Safetensors, HeaderPaddedWithSpacesIsValid) {
  put(raw_file(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}    )", "ab"));
  SafetensorsFile f(path, true);
  EXPECT_EQ(static_cast<const char*>(f.tensor("w").data())[1], 'b');
}

TEST_F(Safetensors, MissingFile) {
  EXPECT_ERROR_CONTAINS(safetensors_read_header(dir.file("absent.safetensors")),
                        "absent.safetensors", "cannot open");
}

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

// Dimensions over 2^63 - 1 once parsed as negative int64 (and with a zero dimension beside them,
// passed the size check).
TEST_F(Safetensors, DimensionsOverInt64AreRefused) {
  put(raw_file(R"({"w":{"dtype":"F32","shape":[9223372036854775808,0],"data_offsets":[0,0]}})",
               ""));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'w'", "over 2^63");
  put(raw_file(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})",
               std::string(4, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'w'", "over 2^63");
  put(raw_file(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]}})",
               std::string(1, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'w'", "overflows");
  put(raw_file(R"({"w":{"dtype":"F32","shape":[9223372036854775807,0],"data_offsets":[0,0]}})",
               ""));
  EXPECT_NO_THROW(safetensors_read_header(path));  // large but representable, and empty
}

TEST_F(Safetensors, OffsetsBeyondTheFile) {
  put(raw_file(
      R"({"w":{"dtype":"F64","shape":[2305843009213693951],"data_offsets":[0,18446744073709551608]}})",
      ""));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'w'", "run past");
  put(raw_file(
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      std::string(4, '\0')));
  EXPECT_ERROR_CONTAINS(safetensors_read_header(path), path, "'b'", "run past");
}

}  // namespace
}  // namespace atom::test
