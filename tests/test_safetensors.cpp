// Tests for tensor/safetensors: exact round trips of every dtype, the writer's layout and
// atomicity, one test per malformed-file case, and interop with the Python `safetensors`
// library in both directions (a checked-in fixture it wrote; a file Loom writes, checked by
// tests/python/check_loom_file.py when LOOM_PYTHON is set).

#include "tensor/safetensors.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/gpt_io.h"
#include "tensor/tensor.h"

#ifndef LOOM_TEST_DATA_DIR
#error "LOOM_TEST_DATA_DIR must name tests/data (set in tests/CMakeLists.txt)"
#endif

namespace {

namespace fs = std::filesystem;
namespace st = loom::safetensors;
using loom::BFloat16;
using loom::DType;
using loom::Half;
using loom::Tensor;

// A fresh directory per test, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("loom_safetensors_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  size_t entry_count() const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(path_), {}));
  }

 private:
  fs::path path_;
};

// u64 little-endian header length (the real length unless `declared_length` is given),
// header text, then the data buffer.
std::vector<std::byte> file_bytes(const std::string& header,
                                  const std::vector<uint8_t>& buffer = {},
                                  std::optional<uint64_t> declared_length = std::nullopt) {
  const uint64_t length = declared_length.value_or(header.size());
  std::vector<std::byte> bytes(8 + header.size() + buffer.size());
  std::memcpy(bytes.data(), &length, 8);  // the test host is little-endian, as Loom requires
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  if (!buffer.empty()) {
    std::memcpy(bytes.data() + 8 + header.size(), buffer.data(), buffer.size());
  }
  return bytes;
}

void write_file(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// The row-major bytes of a tensor (compares bf16/f16 bit patterns and NaN payloads exactly).
std::vector<uint8_t> bytes_of(const Tensor& tensor) {
  Tensor host = tensor.contiguous();
  std::vector<uint8_t> bytes(host.nbytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), host.raw_data(), bytes.size());
  return bytes;
}

std::vector<uint16_t> bits_of(const Tensor& tensor) {
  std::vector<uint8_t> bytes = bytes_of(tensor);
  std::vector<uint16_t> bits(bytes.size() / 2);
  if (!bits.empty()) std::memcpy(bits.data(), bytes.data(), bytes.size());
  return bits;
}

template <typename Bits>
Tensor from_bits(const std::vector<uint16_t>& bits, const loom::Shape& shape) {
  std::vector<Bits> values;
  for (uint16_t b : bits)
    values.push_back(Bits{b});
  return Tensor::from_vector(values, shape);
}

void expect_contains(const std::string& message, const std::vector<std::string>& needles) {
  for (const std::string& needle : needles) {
    EXPECT_NE(message.find(needle), std::string::npos)
        << "expected the message to contain \"" << needle << "\"; message:\n"
        << message;
  }
}

// The loom::Error message load() throws for `path` (a test failure when it does not throw).
std::string load_error(const fs::path& path) {
  try {
    st::load(path);
  } catch (const loom::Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "load(" << path << ") did not throw";
  return "";
}

// Writes a hand-built file and expects load() to reject it with a message that has the
// component tag, the path, and every one of `needles`.
void expect_rejected(const std::string& header, const std::vector<uint8_t>& buffer,
                     const std::vector<std::string>& needles,
                     std::optional<uint64_t> declared_length = std::nullopt) {
  TempDir dir;
  const fs::path path = dir / "bad.safetensors";
  write_file(path, file_bytes(header, buffer, declared_length));
  std::vector<std::string> all = {"[safetensors]", path.string()};
  all.insert(all.end(), needles.begin(), needles.end());
  expect_contains(load_error(path), all);
}

// A valid single-tensor entry, for building headers.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// A header object from entries: object({entry(...), entry(...)}).
std::string object(std::initializer_list<std::string> entries) {
  std::string text = "{";  // appended step by step: GCC 12 warns (-Wrestrict) on "{" + string&&
  for (const std::string& e : entries) {
    if (text.size() > 1) text += ",";
    text += e;
  }
  text += "}";
  return text;
}

// One tensor of every dtype, with edge values: extremes, signed zero, infinities, NaN with a
// payload, subnormals, a 0-d scalar and a zero-element tensor.
st::TensorMap all_dtypes() {
  const float nan_payload = std::bit_cast<float>(uint32_t{0x7fc00001});
  return {
      {"f64_scalar", Tensor::from_vector<double>({3.141592653589793}, {})},
      {"f64", Tensor::from_vector<double>(
                  {-0.0, 1e-310, 1.7976931348623157e308, -std::numeric_limits<double>::infinity()},
                  {2, 2})},
      {"f32", Tensor::from_vector<float>(
                  {0.5f, -1.25f, 3.4028235e38f, 1e-45f, -0.0f,
                   std::numeric_limits<float>::infinity(), nan_payload, 6.103515625e-05f},
                  {2, 4})},
      {"bf16", from_bits<BFloat16>({0x3F80, 0xC000, 0x7F80, 0x0001, 0x7FC1}, {5})},
      {"f16", from_bits<Half>({0x3C00, 0x8000, 0x7C00, 0x0001}, {2, 2})},
      {"i32",
       Tensor::from_vector<int32_t>(
           {std::numeric_limits<int32_t>::min(), -1, 0, std::numeric_limits<int32_t>::max()}, {4})},
      {"i32_empty", Tensor::empty({0, 3}, DType::I32)},
      {"i64",
       Tensor::from_vector<int64_t>(
           {std::numeric_limits<int64_t>::min(), 0, std::numeric_limits<int64_t>::max()}, {3})},
      {"u8", Tensor::from_vector<uint8_t>({0, 1, 127, 128, 254, 255}, {2, 3, 1})},
  };
}

void expect_same_tensors(const st::TensorMap& actual, const st::TensorMap& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, want] : expected) {
    SCOPED_TRACE("tensor " + name);
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << "missing tensor";
    const Tensor& got = it->second;
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_EQ(got.shape(), want.shape());
    EXPECT_TRUE(got.device().is_cpu());
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_EQ(bytes_of(got), bytes_of(want));
  }
}

// --- round trips ----------------------------------------------------------------------------

TEST(Safetensors, RoundTripAllDtypes) {
  TempDir dir;
  const fs::path path = dir / "all.safetensors";
  const st::TensorMap tensors = all_dtypes();
  st::save(path, tensors);
  const st::Contents loaded = st::load(path);
  expect_same_tensors(loaded.tensors, tensors);
  EXPECT_TRUE(loaded.metadata.empty());

  // Spot-check decoded values too, not only bytes.
  EXPECT_EQ(loaded.tensors.at("f64_scalar").dim(), 0);
  EXPECT_EQ(loaded.tensors.at("f64_scalar").item(), 3.141592653589793);
  EXPECT_EQ(loaded.tensors.at("i32_empty").numel(), 0);
  EXPECT_EQ(bits_of(loaded.tensors.at("bf16")),
            (std::vector<uint16_t>{0x3F80, 0xC000, 0x7F80, 0x0001, 0x7FC1}));
  EXPECT_EQ(bits_of(loaded.tensors.at("f16")),
            (std::vector<uint16_t>{0x3C00, 0x8000, 0x7C00, 0x0001}));
  EXPECT_EQ(loaded.tensors.at("i64").to_vector<int64_t>()[0], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(loaded.tensors.at("u8").to_vector<uint8_t>(),
            (std::vector<uint8_t>{0, 1, 127, 128, 254, 255}));
}

TEST(Safetensors, SerializeParseRoundTripIsDeterministic) {
  const st::TensorMap tensors = all_dtypes();
  const st::Metadata metadata = {{"step", "7"}};
  const std::vector<std::byte> bytes = st::serialize(tensors, metadata);
  const st::Contents parsed = st::parse(bytes, "memory");
  expect_same_tensors(parsed.tensors, tensors);
  EXPECT_EQ(parsed.metadata, metadata);
  EXPECT_EQ(st::serialize(parsed.tensors, parsed.metadata), bytes);
}

TEST(Safetensors, EmptyTensorMapRoundTrips) {
  TempDir dir;
  const fs::path path = dir / "empty.safetensors";
  st::save(path, {});
  const st::Contents loaded = st::load(path);
  EXPECT_TRUE(loaded.tensors.empty());
  EXPECT_TRUE(loaded.metadata.empty());
  EXPECT_EQ(fs::file_size(path), 16u);  // prefix + "{}" padded to 8 bytes
}

TEST(Safetensors, MetadataKept) {
  TempDir dir;
  const fs::path path = dir / "meta.safetensors";
  const st::Metadata metadata = {
      {"format", "pt"}, {"empty", ""}, {"quote \" and \\", "line\nbreak"}, {"unicode", "λ→∞"}};
  st::save(path, {{"w", Tensor::ones({2}, DType::F32)}}, metadata);
  const st::Contents loaded = st::load(path);
  EXPECT_EQ(loaded.metadata, metadata);
  EXPECT_EQ(loaded.tensors.at("w").to_vector<float>(), (std::vector<float>{1.0f, 1.0f}));
}

TEST(Safetensors, WriterLayout) {
  const st::TensorMap tensors = {
      {"b", Tensor::from_vector<float>({1.0f, 2.0f}, {2})},
      {"a", Tensor::from_vector<uint8_t>({1, 2, 3}, {3})},
      {"c", Tensor::from_vector<int64_t>({5}, {1})},
  };
  const std::vector<std::byte> bytes = st::serialize(tensors, {{"k", "v"}});
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size % 8, 0u) << "header must be padded to a multiple of 8 bytes";
  ASSERT_EQ(bytes.size(), 8 + header_size + 3 + 8 + 8);

  const std::string text(reinterpret_cast<const char*>(bytes.data() + 8), header_size);
  const size_t json_end = text.find_last_not_of(' ') + 1;
  EXPECT_EQ(text[json_end - 1], '}');
  const nlohmann::json header = nlohmann::json::parse(text);
  EXPECT_EQ(header["__metadata__"], nlohmann::json({{"k", "v"}}));
  // Buffer order is name order, back to back.
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({0, 3}));
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json({3, 11}));
  EXPECT_EQ(header["c"]["data_offsets"], nlohmann::json({11, 19}));
  EXPECT_EQ(header["b"]["dtype"], "F32");
  EXPECT_EQ(header["b"]["shape"], nlohmann::json({2}));
  const std::byte* buffer = bytes.data() + 8 + header_size;
  EXPECT_EQ(std::to_integer<int>(buffer[2]), 3);  // last byte of "a"
  float b1 = 0;
  std::memcpy(&b1, buffer + 3 + 4, 4);
  EXPECT_EQ(b1, 2.0f);
}

TEST(Safetensors, NonContiguousInputSavedAsLogicalValues) {
  TempDir dir;
  const fs::path path = dir / "views.safetensors";
  const Tensor base = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor transposed = base.transpose(0, 1);  // [3, 2]
  const Tensor narrowed = base.narrow(1, 1, 2);    // [2, 2], offset 1
  const Tensor expanded = Tensor::from_vector<int32_t>({7, 8}, {2}).expand({3, 2});
  ASSERT_FALSE(transposed.is_contiguous());
  st::save(path, {{"t", transposed}, {"n", narrowed}, {"e", expanded}});
  const st::Contents loaded = st::load(path);
  EXPECT_EQ(loaded.tensors.at("t").shape(), (loom::Shape{3, 2}));
  EXPECT_EQ(loaded.tensors.at("t").to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(loaded.tensors.at("n").to_vector<float>(), (std::vector<float>{2, 3, 5, 6}));
  EXPECT_EQ(loaded.tensors.at("e").to_vector<int32_t>(), (std::vector<int32_t>{7, 8, 7, 8, 7, 8}));
}

TEST(Safetensors, TensorRequiringGradIsSavedWithoutHistory) {
  TempDir dir;
  const fs::path path = dir / "grad.safetensors";
  Tensor w = Tensor::from_vector<float>({1, 2}, {2});
  w.set_requires_grad(true);
  st::save(path, {{"w", w}});
  const Tensor loaded = st::load(path).tensors.at("w");
  EXPECT_FALSE(loaded.requires_grad());
  EXPECT_EQ(loaded.to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(Safetensors, ReadsForeignLayoutAndUnpaddedHeader) {
  // Tensors stored out of name order, header length not a multiple of 8, trailing spaces.
  TempDir dir;
  const fs::path path = dir / "foreign.safetensors";
  const std::string header =
      object({entry("a", "I32", "[1]", 4, 8), entry("b", "U8", "[4]", 0, 4)}) + "  ";
  ASSERT_NE(header.size() % 8, 0u);
  write_file(path, file_bytes(header, {1, 2, 3, 4, 0x2a, 0, 0, 0}));
  const st::Contents loaded = st::load(path);
  EXPECT_EQ(loaded.tensors.at("a").to_vector<int32_t>(), (std::vector<int32_t>{42}));
  EXPECT_EQ(loaded.tensors.at("b").to_vector<uint8_t>(), (std::vector<uint8_t>{1, 2, 3, 4}));
}

// --- atomic writes --------------------------------------------------------------------------

TEST(Safetensors, AtomicWriteLeavesNoTempFile) {
  TempDir dir;
  const fs::path path = dir / "ckpt.safetensors";
  st::save(path, {{"x", Tensor::full({4}, 1.0)}});
  st::save(path, {{"x", Tensor::full({2}, 2.0)}});  // replaces the existing file
  EXPECT_EQ(dir.entry_count(), 1u) << "only the target file may remain";
  EXPECT_EQ(st::load(path).tensors.at("x").to_vector<float>(), (std::vector<float>{2, 2}));
}

TEST(Safetensors, FailedSaveKeepsOldFile) {
  TempDir dir;
  const fs::path path = dir / "ckpt.safetensors";
  st::save(path, {{"x", Tensor::full({3}, 5.0)}});
  const std::vector<std::byte> before = read_file(path);

  try {
    st::save(path, {{"good", Tensor::ones({2})}, {"x", Tensor()}});
    ADD_FAILURE() << "saving an undefined tensor did not throw";
  } catch (const loom::Error& error) {
    expect_contains(error.what(), {"[safetensors]", path.string(), "'x'", "undefined"});
  }
  try {
    st::save(path, {{"__metadata__", Tensor::ones({2})}});
    ADD_FAILURE() << "saving a tensor named __metadata__ did not throw";
  } catch (const loom::Error& error) {
    expect_contains(error.what(), {"[safetensors]", path.string(), "reserved"});
  }
  EXPECT_EQ(read_file(path), before) << "a failed save must not touch the old file";
  EXPECT_EQ(dir.entry_count(), 1u) << "a failed save must not leave a temporary file";
}

TEST(Safetensors, SaveIntoMissingDirectoryFails) {
  TempDir dir;
  const fs::path path = dir / "no_such_dir" / "ckpt.safetensors";
  try {
    st::save(path, {{"x", Tensor::ones({1})}});
    ADD_FAILURE() << "save into a missing directory did not throw";
  } catch (const loom::Error& error) {
    expect_contains(error.what(), {"[safetensors]", path.string(), "cannot create temporary"});
  }
}

// --- malformed files: one test per rejection ----------------------------------------------

TEST(Safetensors, RejectsMissingFile) {
  TempDir dir;
  const fs::path path = dir / "absent.safetensors";
  expect_contains(load_error(path), {"[safetensors]", path.string(), "cannot open"});
}

TEST(Safetensors, RejectsFileShorterThan8Bytes) {
  TempDir dir;
  const fs::path path = dir / "short.safetensors";
  write_file(path, std::vector<std::byte>(5));
  expect_contains(load_error(path), {"[safetensors]", path.string(), "5 bytes", "8-byte"});
  write_file(path, {});
  expect_contains(load_error(path), {"[safetensors]", path.string(), "0 bytes"});
}

TEST(Safetensors, RejectsHeaderLengthPastEndOfFile) {
  // 8 + 10 bytes in the file, but the prefix claims a 100-byte header.
  expect_rejected("{}        ", {}, {"header length 100", "18 bytes"}, 100);
}

TEST(Safetensors, RejectsHugeHeaderLengthWithoutOverflow) {
  expect_rejected("{}", {}, {"header length 18446744073709551615", "10 bytes"},
                  std::numeric_limits<uint64_t>::max());
  expect_rejected("{}", {}, {"header length 18446744073709551608"},
                  std::numeric_limits<uint64_t>::max() - 7);
}

TEST(Safetensors, RejectsHeaderThatIsNotJson) {
  expect_rejected("{\"a\": {\"dtype\": ", {}, {"not valid JSON", "parse error"});
  expect_rejected("", {}, {"not valid JSON"});
  expect_rejected("{\"w\": 1e400}", {}, {"not valid JSON", "number overflow"});
}

TEST(Safetensors, RejectsInvalidUtf8InHeader) {
  expect_rejected("{\"\xff\xfe\": 1}", {}, {"not valid JSON"});
}

TEST(Safetensors, RejectsHeaderThatIsNotAnObject) {
  expect_rejected("[1, 2, 3]", {}, {"header is a JSON array", "expected a JSON object"});
  expect_rejected("\"F32\"", {}, {"header is a JSON string"});
}

TEST(Safetensors, RejectsEntryThatIsNotAnObject) {
  expect_rejected("{\"w\": [1, 2]}", {}, {"tensor 'w'", "entry is a JSON array"});
}

TEST(Safetensors, RejectsEntryMissingDtype) {
  expect_rejected("{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", {0, 0, 0, 0},
                  {"tensor 'w'", "no \"dtype\""});
}

TEST(Safetensors, RejectsEntryMissingShape) {
  expect_rejected("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", {0, 0, 0, 0},
                  {"tensor 'w'", "no \"shape\""});
}

TEST(Safetensors, RejectsEntryMissingDataOffsets) {
  expect_rejected("{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", {0, 0, 0, 0},
                  {"tensor 'w'", "no \"data_offsets\""});
}

TEST(Safetensors, RejectsEntryFieldsOfWrongJsonType) {
  expect_rejected("{\"w\": {\"dtype\": 32, \"shape\": [1], \"data_offsets\": [0, 4]}}",
                  {0, 0, 0, 0}, {"tensor 'w'", "\"dtype\" is a JSON number"});
  expect_rejected("{\"w\": {\"dtype\": \"F32\", \"shape\": \"1\", \"data_offsets\": [0, 4]}}",
                  {0, 0, 0, 0}, {"tensor 'w'", "\"shape\" is a JSON string"});
  expect_rejected("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {\"a\": 0}}}",
                  {0, 0, 0, 0}, {"tensor 'w'", "\"data_offsets\" is {\"a\":0}"});
}

TEST(Safetensors, RejectsNegativeShape) {
  expect_rejected(object({entry("w", "F32", "[2, -3]", 0, 0)}), {},
                  {"tensor 'w'", "dimension 1 = -3", "non-negative integer"});
}

TEST(Safetensors, RejectsNonIntegerShape) {
  expect_rejected(object({entry("w", "F32", "[1.5]", 0, 4)}), {0, 0, 0, 0},
                  {"tensor 'w'", "dimension 0 = 1.5"});
  expect_rejected(object({entry("w", "F32", "[\"2\"]", 0, 8)}), std::vector<uint8_t>(8),
                  {"tensor 'w'", "dimension 0 = \"2\""});
}

TEST(Safetensors, RejectsUnknownDtype) {
  expect_rejected(object({entry("w", "F33", "[1]", 0, 4)}), {0, 0, 0, 0},
                  {"tensor 'w'", "unknown dtype 'F33'", "Loom reads F64, F32"});
}

TEST(Safetensors, RejectsUnsupportedDtype) {
  for (const char* dtype : {"BOOL", "I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2"}) {
    SCOPED_TRACE(dtype);
    expect_rejected(object({entry("w", dtype, "[1]", 0, 1)}), {0},
                    {std::string("unsupported dtype ") + dtype +
                     "; Loom reads F64, F32, F16, BF16, I64, I32, U8"});
  }
}

TEST(Safetensors, RejectsMalformedDataOffsets) {
  const std::string head = "{\"w\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": ";
  const std::vector<uint8_t> buffer(4);
  for (const char* offsets : {"[0]", "[0, 4, 8]", "[-1, 3]", "[0, 4.0]", "[\"0\", 4]"}) {
    SCOPED_TRACE(offsets);
    expect_rejected(head + offsets + "}}", buffer,
                    {"tensor 'w'", "expected [begin, end] with two non-negative integers"});
  }
}

TEST(Safetensors, RejectsDataOffsetsWithBeginAfterEnd) {
  expect_rejected(object({entry("w", "U8", "[4]", 8, 4)}), std::vector<uint8_t>(8),
                  {"tensor 'w'", "data_offsets [8, 4]", "begin > end"});
}

TEST(Safetensors, RejectsDataOffsetsPastBuffer) {
  expect_rejected(object({entry("w", "F32", "[4]", 0, 16)}), std::vector<uint8_t>(12),
                  {"tensor 'w'", "data_offsets [0, 16]", "12 bytes"});
}

TEST(Safetensors, RejectsOverlappingTensors) {
  expect_rejected(object({entry("a", "U8", "[4]", 0, 4), entry("b", "U8", "[4]", 2, 6)}),
                  std::vector<uint8_t>(6), {"'a'", "'b'", "overlap"});
}

TEST(Safetensors, RejectsHoleInBuffer) {
  expect_rejected(object({entry("a", "U8", "[2]", 0, 2), entry("b", "U8", "[2]", 4, 6)}),
                  std::vector<uint8_t>(6), {"bytes [2, 4)", "belong to no tensor", "'b'"});
}

TEST(Safetensors, RejectsBufferNotFullyCovered) {
  expect_rejected(object({entry("a", "U8", "[2]", 0, 2)}), std::vector<uint8_t>(5),
                  {"last 3 bytes", "[2, 5)", "belong to no tensor"});
}

TEST(Safetensors, RejectsByteCountMismatch) {
  expect_rejected(object({entry("w", "F32", "[2, 3]", 0, 20)}), std::vector<uint8_t>(20),
                  {"tensor 'w'", "shape [2, 3]", "dtype F32", "needs 24 bytes", "give 20 bytes"});
}

TEST(Safetensors, RejectsShapeWhoseSizeOverflows) {
  // 2^32 * 2^32 * 4 elements would wrap to 0 in 64-bit arithmetic and "match" [0, 0].
  expect_rejected(object({entry("w", "F32", "[4294967296, 4294967296, 4]", 0, 0)}), {},
                  {"tensor 'w'", "too large", "below 2^63"});
  // Empty, but Loom's int64 strides for it would still overflow.
  expect_rejected(object({entry("w", "F32", "[0, 4611686018427387904, 4]", 0, 0)}), {},
                  {"tensor 'w'", "too large"});
  // 2^61 f64 elements is 2^64 bytes, which wraps to 0.
  expect_rejected(object({entry("w", "F64", "[2305843009213693952]", 0, 0)}), {},
                  {"tensor 'w'", "below 2^64 bytes"});
  expect_rejected(object({entry("w", "U8", "[18446744073709551615]", 0, 0)}), {},
                  {"tensor 'w'", "expected at most 9223372036854775807"});
}

TEST(Safetensors, RejectsNonStringMetadata) {
  expect_rejected("{\"__metadata__\": {\"step\": 7}}", {},
                  {"\"__metadata__\" key 'step'", "number value (7)", "expected a string"});
  expect_rejected("{\"__metadata__\": [\"a\"]}", {},
                  {"\"__metadata__\" is a JSON array", "expected an object"});
}

TEST(Safetensors, RejectsDuplicateKeys) {
  expect_rejected(object({entry("a", "U8", "[1]", 0, 1), entry("a", "U8", "[1]", 0, 1)}), {0},
                  {"key 'a' appears twice at the top level"});
  expect_rejected(
      "{\"a\": {\"dtype\": \"U8\", \"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 1]}}",
      {0}, {"key 'dtype' appears twice inside the entry 'a'"});
}

TEST(Safetensors, ParseNamesItsOrigin) {
  const std::vector<std::byte> bytes(3);
  try {
    st::parse(bytes, "shard-7 from the network");
    ADD_FAILURE() << "parse of 3 bytes did not throw";
  } catch (const loom::Error& error) {
    expect_contains(error.what(), {"[safetensors] shard-7 from the network:", "3 bytes"});
  }
}

// --- a GPT file's architecture (nn/gpt_io.h) ----------------------------------------------

// The message gpt_config_from_checkpoint throws for `contents` (a test failure when it does
// not throw).
std::string gpt_config_error(const st::Contents& contents) {
  try {
    loom::nn::gpt_config_from_checkpoint(contents, 1);
  } catch (const loom::Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "gpt_config_from_checkpoint did not throw";
  return "";
}

// "loom.heads" must be a decimal divisor of the embedding width, and the blocks h.0 .. h.L-1,
// or the error names the metadata key or the tensor and what is accepted (a bare std::stoll
// used to answer "stoll").
TEST(GptCheckpoint, ConfigRefusesBadHeadsAndBlockNames) {
  st::Contents good;
  good.tensors = {{"wte.weight", Tensor::zeros({256, 16}, DType::F32)},
                  {"wpe.weight", Tensor::zeros({8, 16}, DType::F32)},
                  {"h.0.ln_1.weight", Tensor::zeros({16}, DType::F32)},
                  {"h.1.ln_1.weight", Tensor::zeros({16}, DType::F32)}};
  good.metadata = {{"loom.heads", "4"}};
  const loom::nn::GPTConfig config = loom::nn::gpt_config_from_checkpoint(good, 1);
  EXPECT_EQ(config.heads, 4);
  EXPECT_EQ(config.layers, 2);
  EXPECT_EQ(config.embd, 16);

  for (const std::string heads : {"abc", "99999999999999999999", "0", "-1", "3", " 4", "4x", ""}) {
    st::Contents bad = good;
    bad.metadata["loom.heads"] = heads;
    expect_contains(gpt_config_error(bad),
                    {"'loom.heads' is '" + heads + "'", "an integer from 1 to 16",
                     "divides the embedding width 16"});
  }

  st::Contents huge = good;
  huge.tensors.erase("h.1.ln_1.weight");
  huge.tensors.emplace("h.99999999999999999999.ln_1.weight", Tensor::zeros({16}, DType::F32));
  expect_contains(gpt_config_error(huge),
                  {"tensor 'h.99999999999999999999.ln_1.weight' has block index "
                   "99999999999999999999",
                   "expected h.N with N from 0 to 3"});

  st::Contents gap = good;
  gap.tensors.erase("h.1.ln_1.weight");
  gap.tensors.emplace("h.3.ln_1.weight", Tensor::zeros({16}, DType::F32));
  expect_contains(gpt_config_error(gap),
                  {"tensors of block h.3 but none of block h.1", "every block from h.0 to h.3"});
}

// --- interop with the Python safetensors library --------------------------------------------

TEST(Safetensors, LoadsPythonWrittenFile) {
  // Written by tests/python/make_safetensors_fixture.py; the values below are its values.
  const st::Contents loaded = st::load(fs::path(LOOM_TEST_DATA_DIR) / "python_written.safetensors");
  EXPECT_EQ(loaded.metadata,
            (st::Metadata{{"format", "pt"}, {"source", "make_safetensors_fixture.py"}}));
  ASSERT_EQ(loaded.tensors.size(), 7u);

  const Tensor& f32 = loaded.tensors.at("f32");
  EXPECT_EQ(f32.dtype(), DType::F32);
  EXPECT_EQ(f32.shape(), (loom::Shape{2, 3}));
  EXPECT_EQ(f32.to_vector<float>(),
            (std::vector<float>{0.5f, -1.25f, 3.0f, 1024.0f, -0.0f, 6.103515625e-05f}));
  EXPECT_TRUE(std::signbit(f32.to_vector<float>()[4]));

  const Tensor& f16 = loaded.tensors.at("f16");
  EXPECT_EQ(f16.dtype(), DType::F16);
  EXPECT_EQ(f16.shape(), (loom::Shape{4}));
  EXPECT_EQ(bits_of(f16), (std::vector<uint16_t>{0x3C00, 0xC000, 0x2E66, 0x7BFF}));

  const Tensor& bf16 = loaded.tensors.at("bf16");
  EXPECT_EQ(bf16.dtype(), DType::BF16);
  EXPECT_EQ(bf16.shape(), (loom::Shape{2, 2}));
  EXPECT_EQ(bits_of(bf16), (std::vector<uint16_t>{0x3F80, 0xBF00, 0x4049, 0x7F80}));

  const Tensor& i64 = loaded.tensors.at("i64");
  EXPECT_EQ(i64.dtype(), DType::I64);
  EXPECT_EQ(i64.to_vector<int64_t>(), (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 0,
                                                            std::numeric_limits<int64_t>::max()}));

  const Tensor& u8 = loaded.tensors.at("u8");
  EXPECT_EQ(u8.dtype(), DType::U8);
  EXPECT_EQ(u8.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 127, 128, 255}));

  const Tensor& scalar = loaded.tensors.at("scalar");
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.item(), 42.0);

  const Tensor& empty = loaded.tensors.at("empty");
  EXPECT_EQ(empty.dtype(), DType::F32);
  EXPECT_EQ(empty.shape(), (loom::Shape{0, 4}));
}

// Values every safetensors reader can compare exactly (no NaN or infinity: JSON has none).
nlohmann::json expected_json(const st::TensorMap& tensors, const st::Metadata& metadata) {
  static const std::map<DType, std::string> kNames = {
      {DType::F64, "F64"}, {DType::F32, "F32"}, {DType::F16, "F16"}, {DType::BF16, "BF16"},
      {DType::I64, "I64"}, {DType::I32, "I32"}, {DType::U8, "U8"}};
  nlohmann::json out = {{"metadata", metadata}, {"tensors", nlohmann::json::object()}};
  for (const auto& [name, tensor] : tensors) {
    nlohmann::json values = nlohmann::json::array();
    if (loom::is_floating(tensor.dtype())) {
      for (double v : tensor.to_vector<double>())
        values.push_back(v);
    } else {
      for (int64_t v : tensor.to_vector<int64_t>())
        values.push_back(v);
    }
    out["tensors"][name] = {
        {"dtype", kNames.at(tensor.dtype())}, {"shape", tensor.shape()}, {"values", values}};
  }
  return out;
}

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text)
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

TEST(Safetensors, PythonReadsLoomFile) {
  // LOOM_PYTHON, else the .venv that scripts/install-deps.sh creates. Under CI the check is
  // required; elsewhere it is skipped with instructions when no such python exists.
  const char* from_env = std::getenv("LOOM_PYTHON");
  std::string python = from_env != nullptr && *from_env != '\0' ? from_env : LOOM_DEFAULT_PYTHON;
  if (!fs::exists(python)) {
    const char* ci = std::getenv("CI");
    if (ci != nullptr && std::string(ci) == "true") {
      FAIL() << "CI=true but no python with safetensors at " << python
             << "; run scripts/install-deps.sh or set LOOM_PYTHON";
    }
    GTEST_SKIP() << "no python with safetensors at " << python
                 << ": run scripts/install-deps.sh (creates .venv) or set LOOM_PYTHON";
  }
  TempDir dir;
  const fs::path path = dir / "loom_written.safetensors";
  const fs::path expected_path = dir / "expected.json";
  const Tensor base = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const st::TensorMap tensors = {
      {"f64", Tensor::from_vector<double>({3.141592653589793, -0.0, 1e-310}, {3})},
      {"f32_transposed", base.transpose(0, 1)},
      {"f32_scalar", Tensor::from_vector<float>({-2.5f}, {})},
      {"f32_empty", Tensor::empty({0, 3}, DType::F32)},
      {"bf16", from_bits<BFloat16>({0x3F80, 0xC000, 0x4049, 0x0001}, {2, 2})},
      {"f16", from_bits<Half>({0x3C00, 0x8000, 0x2E66, 0x7BFF, 0x0001}, {5})},
      {"i32", Tensor::from_vector<int32_t>({std::numeric_limits<int32_t>::min(), 0, 7}, {3})},
      {"i64",
       Tensor::from_vector<int64_t>(
           {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}, {1, 2})},
      {"u8", Tensor::from_vector<uint8_t>({0, 128, 255}, {3, 1})},
  };
  const st::Metadata metadata = {{"format", "pt"}, {"writer", "loom"}};
  st::save(path, tensors, metadata);
  {
    std::ofstream out(expected_path);
    out << expected_json(tensors, metadata).dump(2);
  }
  const fs::path script = fs::path(LOOM_TEST_DATA_DIR) / ".." / "python" / "check_loom_file.py";
  const std::string command = shell_quote(python) + " " + shell_quote(script.string()) + " " +
                              shell_quote(path.string()) + " " +
                              shell_quote(expected_path.string());
  const int status = std::system(command.c_str());
  ASSERT_NE(status, -1) << "could not run: " << command;
  ASSERT_TRUE(WIFEXITED(status)) << "did not exit normally: " << command;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the Python safetensors check failed: " << command;
}

}  // namespace
