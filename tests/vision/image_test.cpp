// The image processor (src/vision/image.h) against Pillow: tests/fixtures/images/ holds the
// inputs and references.safetensors the outputs of Pillow 9.4 + transformers' processing steps
// (tools/make_image_fixtures.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "loader/safetensors.h"
#include "vision/image.h"

namespace atom::vision {
namespace {

std::string images_dir() {
  const char* e = std::getenv("ATOM_SOURCE_DIR");
  return std::string(e && *e ? e : ATOM_SOURCE_DIR) + "/tests/fixtures/images/";
}

std::vector<uint8_t> read_bytes(const std::string& name) {
  std::ifstream f(images_dir() + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

const SafetensorsFile& refs() {
  static SafetensorsFile f(images_dir() + "references.safetensors", false);
  return f;
}

const nlohmann::json& cases() {
  static nlohmann::json j = nlohmann::json::parse(refs().header().metadata.at("cases"));
  return j;
}

bool has_ref(const std::string& name) { return refs().header().find(name) != nullptr; }

// A reference U8 [H, W, 3] as an RgbImage.
RgbImage ref_image(const std::string& name) {
  Tensor t = refs().tensor(name);
  EXPECT_EQ(t.dtype(), DType::kU8) << name;
  EXPECT_EQ(t.dim(), 3) << name;
  RgbImage im{static_cast<int>(t.size(1)), static_cast<int>(t.size(0)), {}};
  const uint8_t* p = t.ptr<uint8_t>();
  im.pixels.assign(p, p + t.numel());
  return im;
}

struct U8Diff {
  bool same_size = true;
  int64_t n = 0, exact = 0;
  int max_abs = 0;
};

// Fails (and reports max_abs 256) when the sizes differ.
U8Diff compare(const RgbImage& got, const RgbImage& want, const std::string& what) {
  U8Diff d;
  if (got.width != want.width || got.height != want.height ||
      got.pixels.size() != want.pixels.size()) {
    ADD_FAILURE() << what << ": size " << got.width << "x" << got.height << " against "
                  << want.width << "x" << want.height;
    d.same_size = false;
    d.max_abs = 256;
    return d;
  }
  d.n = static_cast<int64_t>(got.pixels.size());
  for (size_t i = 0; i < got.pixels.size(); ++i) {
    int e = std::abs(int(got.pixels[i]) - int(want.pixels[i]));
    d.exact += e == 0;
    d.max_abs = std::max(d.max_abs, e);
  }
  return d;
}

ProcessorParams params_of(const nlohmann::json& c) {
  ProcessorParams p;
  p.patch_size = c.at("patch_size");
  p.merge_kernel_size = c.at("merge_kernel_size");
  p.in_patch_limit = c.at("in_patch_limit");
  p.patch_limit_on_one_side = c.at("patch_limit_on_one_side");
  return p;
}

TEST(ImageDecode, MatchesPillowForEveryFixture) {
  int files = 0;
  for (const auto& e : refs().header().entries) {
    if (e.name.rfind("decoded/", 0) != 0) continue;
    const std::string name = e.name.substr(8);
    SCOPED_TRACE(name);
    RgbImage got = decode_image(read_bytes(name));
    U8Diff d = compare(got, ref_image(e.name), name);
    // The same libjpeg-turbo as Pillow's, with Pillow's settings (islow IDCT, fancy
    // upsampling): JPEGs decode exactly too (measured: every pixel of every fixture).
    EXPECT_EQ(d.max_abs, 0) << name << ": " << d.exact << " of " << d.n << " values exact";
    ImageInfo info = probe_image(read_bytes(name));
    EXPECT_EQ(info.width, got.width);
    EXPECT_EQ(info.height, got.height);
    EXPECT_EQ(info.format, name.ends_with(".jpg") ? ImageFormat::kJpeg : ImageFormat::kPng);
    ++files;
  }
  EXPECT_EQ(files, 13);
}

TEST(ImageResize, MatchesPillowBicubic) {
  int n = 0;
  for (const auto& [key, c] : cases().items()) {
    if (key.rfind("plain_", 0) != 0) continue;
    SCOPED_TRACE(key);
    RgbImage src = ref_image("decoded/" + c.at("image").get<std::string>());
    RgbImage got = resize_bicubic(src, c.at("width"), c.at("height"));
    U8Diff d = compare(got, ref_image("plain_resize/" + key.substr(6)), key);
    // Pillow's own fixed-point coefficients and rounding: exact (measured on every case).
    EXPECT_EQ(d.max_abs, 0) << d.exact << " of " << d.n << " values exact";
    ++n;
  }
  EXPECT_EQ(n, 6);
}

TEST(ImageResize, SameSizeIsACopy) {
  RgbImage src = ref_image("decoded/rgba.png");
  RgbImage got = resize_bicubic(src, src.width, src.height);
  EXPECT_EQ(got.pixels, src.pixels);
}

TEST(ImageProcessor, MatchesTransformersSteps) {
  int n = 0;
  for (const auto& [key, c] : cases().items()) {
    if (key.rfind("plain_", 0) == 0) continue;
    SCOPED_TRACE(key);
    const ProcessorParams p = params_of(c);
    const std::vector<uint8_t> bytes = read_bytes(c.at("image"));
    RgbImage image = decode_image(bytes);
    ResizePlan plan = navit_resize(image.width, image.height, p);
    // The resized image (before padding) against Pillow's.
    RgbImage resized = (plan.resized_width == image.width && plan.resized_height == image.height)
                           ? image
                           : resize_bicubic(image, plan.resized_width, plan.resized_height);
    U8Diff d = compare(resized, ref_image("resized/" + key), key);
    EXPECT_EQ(d.max_abs, 0) << d.exact << " of " << d.n << " values exact";

    VisionInput in = process_image_bytes(bytes, p);
    Tensor grid =
        refs().tensor("grid_thw/" + key).clone();  // aligned: the file packs tensors unaligned
    ASSERT_EQ(grid.numel(), 3);
    const int64_t* g = grid.ptr<int64_t>();
    EXPECT_EQ(in.grid_thw(), (std::array<int64_t, 3>{g[0], g[1], g[2]}));
    ImageGrid g2 = image_grid(image.width, image.height, p);
    EXPECT_EQ(g2.h, in.grid.h);
    EXPECT_EQ(g2.w, in.grid.w);
    EXPECT_EQ(in.num_tokens, g[1] * g[2] / 4);
    const int64_t per_patch = 3 * p.patch_size * p.patch_size;
    ASSERT_EQ(static_cast<int64_t>(in.pixel_values.size()), g[1] * g[2] * per_patch);
    if (has_ref("pixel_values/" + key)) {
      Tensor pv = refs().tensor("pixel_values/" + key).clone();
      ASSERT_EQ(pv.numel(), static_cast<int64_t>(in.pixel_values.size()));
      const float* want = pv.ptr<float>();
      int64_t bad = 0;
      for (size_t i = 0; i < in.pixel_values.size(); ++i) {
        bad += !(std::fabs(in.pixel_values[i] - want[i]) <= 1e-6f);  // NaN counts as bad
      }
      EXPECT_EQ(bad, 0) << "pixel_values off by more than 1e-6";
      // Padding is -1: the last patch's last value is a padded pixel in every case here.
      EXPECT_EQ(in.pixel_values.back(), -1.0f);
    }
    ++n;
  }
  EXPECT_EQ(n, 5);
}

TEST(ImageProcessor, PatchLayoutIsRowMajorChannelFirst) {
  // A 28 x 14 image (2 patches across, 1 down, merge 1): patch j holds columns 14j..14j+13.
  RgbImage im{28, 14, std::vector<uint8_t>(28 * 14 * 3)};
  for (int y = 0; y < 14; ++y)
    for (int x = 0; x < 28; ++x)
      for (int c = 0; c < 3; ++c) im.pixels[(y * 28 + x) * 3 + c] = uint8_t(x * 3 + c + y);
  ProcessorParams p;
  p.merge_kernel_size = 1;
  VisionInput in = preprocess_image(im, p);
  ASSERT_EQ(in.grid_thw(), (std::array<int64_t, 3>{1, 1, 2}));
  for (int j = 0; j < 2; ++j)
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 14; ++y)
        for (int x = 0; x < 14; ++x) {
          float want = (float((14 * j + x) * 3 + c + y) - 127.5f) / 127.5f;
          ASSERT_EQ(in.pixel_values[((j * 3 + c) * 14 + y) * 14 + x], want);
        }
}

TEST(ImageProcessor, NavitResizeKeepsTheAspectRatio) {
  ProcessorParams p;
  // Within every limit: padded only.
  ResizePlan r = navit_resize(1000, 200, p);
  EXPECT_EQ(r.resized_width, 1000);
  EXPECT_EQ(r.resized_height, 200);
  EXPECT_EQ(r.padded_width, 1008);
  EXPECT_EQ(r.padded_height, 224);
  // The patch budget: 714 x 71 patches -> scale sqrt(16384 / 50694) = 0.56850...; width stays
  // the long side (transformers' _preprocess would give 568 x 5685).
  r = navit_resize(10000, 1000, p);
  EXPECT_EQ(r.resized_width, 5685);
  EXPECT_EQ(r.resized_height, 568);
  r = navit_resize(1000, 10000, p);
  EXPECT_EQ(r.resized_width, 568);
  EXPECT_EQ(r.resized_height, 5685);
  // The per-side limit, 512 patches = 7168 pixels.
  r = navit_resize(16384, 14, p);
  EXPECT_EQ(r.resized_width, 7168);
  EXPECT_EQ(r.resized_height, 6);
  EXPECT_EQ(r.padded_height, 28);
  // Tiny images: at least one pixel, one merge block.
  r = navit_resize(1, 1, p);
  EXPECT_EQ(r.resized_width, 1);
  EXPECT_EQ(r.padded_width, 28);
  ImageGrid g = image_grid(10000, 1000, p);
  EXPECT_EQ(g.w, 5712 / 14);
  EXPECT_EQ(g.h, 588 / 14);
  EXPECT_EQ(num_image_tokens(g, p), g.h * g.w / 4);
  EXPECT_LE(g.num_patches(), 16384 + 2 * (408 + 42) + 4);  // the budget, up to the padding
}

// --- untrusted input -------------------------------------------------------------------------

std::string error_of(const std::vector<uint8_t>& bytes) {
  try {
    decode_image(bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void put_be32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = uint8_t(v >> (24 - 8 * i));
}

TEST(ImageErrors, EachNamesTheProblem) {
  EXPECT_NE(error_of({}).find("empty input"), std::string::npos) << error_of({});
  std::vector<uint8_t> garbage = {'G', 'I', 'F', '8', '9', 'a', 0, 0};
  EXPECT_NE(error_of(garbage).find("unknown format"), std::string::npos) << error_of(garbage);

  std::vector<uint8_t> png = read_bytes("photo.png");
  std::vector<uint8_t> cut(png.begin(), png.begin() + png.size() / 2);
  std::string m = error_of(cut);
  EXPECT_NE(m.find("malformed PNG: truncated data"), std::string::npos) << m;
  cut.assign(png.begin(), png.begin() + 20);
  m = error_of(cut);
  EXPECT_NE(m.find("truncated PNG"), std::string::npos) << m;

  std::vector<uint8_t> zero = png;
  put_be32(zero, 16, 0);  // IHDR width
  m = error_of(zero);
  EXPECT_NE(m.find("zero size"), std::string::npos) << m;
  std::vector<uint8_t> huge = png;
  put_be32(huge, 16, 20000);
  put_be32(huge, 20, 20000);
  m = error_of(huge);
  EXPECT_NE(m.find("PNG is too large (20000 x 20000"), std::string::npos) << m;
  put_be32(huge, 16, 16384);
  put_be32(huge, 20, 16384);  // each side allowed, 256 Mi pixels not
  m = error_of(huge);
  EXPECT_NE(m.find("= 268435456 pixels"), std::string::npos) << m;
  std::vector<uint8_t> crc = png;
  crc[29] ^= 0xff;  // IHDR's CRC
  m = error_of(crc);
  EXPECT_NE(m.find("malformed PNG: IHDR: CRC error"), std::string::npos) << m;

  std::vector<uint8_t> jpg = read_bytes("photo.jpg");
  cut.assign(jpg.begin(), jpg.begin() + jpg.size() / 2);
  m = error_of(cut);
  EXPECT_NE(m.find("malformed JPEG: truncated data"), std::string::npos) << m;
  cut.assign(jpg.begin(), jpg.begin() + 40);  // inside the headers
  m = error_of(cut);
  EXPECT_NE(m.find("malformed JPEG"), std::string::npos) << m;
  // The SOF0 marker's height and width (big-endian 16-bit, after length and precision).
  std::vector<uint8_t> big = jpg;
  size_t sof = 0;
  for (size_t i = 2; i + 9 < big.size(); ++i) {
    if (big[i] == 0xff && big[i + 1] == 0xc0) {
      sof = i;
      break;
    }
  }
  ASSERT_NE(sof, 0u);
  big[sof + 5] = 0xfd;  // height 65000
  big[sof + 6] = 0xe8;
  m = error_of(big);
  EXPECT_NE(m.find("JPEG is too large (170 x 65000"), std::string::npos) << m;
  EXPECT_THROW(probe_image(big), Error);
  big[sof + 5] = big[sof + 6] = 0;  // height 0
  m = error_of(big);
  EXPECT_NE(m.find("malformed JPEG"), std::string::npos) << m;
}

}  // namespace
}  // namespace atom::vision
