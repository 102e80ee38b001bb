#include "vision/image.h"

// libpng and libjpeg report errors through a callback that must not return: it longjmps back to
// the setjmp of the function that called into the library (png_decode / jpeg_decode below). So
// that no C++ destructor is skipped, every object those functions keep across library calls
// lives in a heap context created before the setjmp, and nothing with a destructor is declared
// between the setjmp and the library calls; the context's destructor frees the library state,
// whichever way the function leaves (error, exception, success).
// jpeglib.h needs FILE and size_t declared before it.
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>
// jpeglib.h first: jerror.h's message codes need its types.
#include <jerror.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/ranges.h>

#include "core/error.h"

namespace atom::vision {
namespace {

constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

uint32_t be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

void check_size(const char* format, uint64_t width, uint64_t height) {
  if (width == 0 || height == 0) {
    fail("image: {} has a zero size ({} x {})", format, width, height);
  }
  if (width > kMaxImageSide || height > kMaxImageSide) {
    fail("image: {} is too large ({} x {}; at most {} pixels a side)", format, width, height,
         kMaxImageSide);
  }
  if (width * height > static_cast<uint64_t>(kMaxImagePixels)) {
    fail("image: {} is too large ({} x {} = {} pixels; at most {})", format, width, height,
         width * height, kMaxImagePixels);
  }
}

ImageFormat detect_format(std::span<const uint8_t> b) {
  if (b.empty()) {
    fail("image: empty input (no bytes)");
  }
  if (b.size() >= 8 && std::memcmp(b.data(), kPngMagic, 8) == 0) {
    return ImageFormat::kPng;
  }
  if (b.size() >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) {
    return ImageFormat::kJpeg;
  }
  fail("image: unknown format ({} bytes starting {:02x}; PNG and JPEG are read)", b.size(),
       fmt::join(b.subspan(0, std::min<size_t>(b.size(), 4)), " "));
}

// The PNG's IHDR read by hand: the size is checked before libpng allocates anything.
ImageInfo png_probe(std::span<const uint8_t> b) {
  if (b.size() < 8 + 8 + 13) {
    fail("image: truncated PNG ({} bytes, no complete IHDR chunk)", b.size());
  }
  const uint8_t* p = b.data() + 8;
  if (be32(p) != 13 || std::memcmp(p + 4, "IHDR", 4) != 0) {
    fail("image: malformed PNG (the first chunk is not a 13-byte IHDR)");
  }
  uint32_t w = be32(p + 8), h = be32(p + 12);
  check_size("PNG", w, h);
  return {ImageFormat::kPng, static_cast<int>(w), static_cast<int>(h)};
}

// --- alpha -----------------------------------------------------------------------------------

// Pillow's Image.alpha_composite(white opaque background, pixel) for one 8-bit channel value
// (AlphaComposite.c: 7 fractional bits, divisions by 255 as shifts). With an opaque background,
// outa255 = 255 * 255 and coef1 = a * 128 exactly.
inline uint8_t over_white(uint32_t v, uint32_t a) {
  if (a == 0) {
    return 255;
  }
  uint32_t coef1 = a * 128;
  uint32_t coef2 = 255 * 128 - coef1;
  uint32_t t = v * coef1 + 255 * coef2 + (0x80 << 7);
  return static_cast<uint8_t>((((t >> 8) + t) >> 8) >> 7);
}

// --- PNG -------------------------------------------------------------------------------------

struct PngContext {
  std::span<const uint8_t> data;
  size_t pos = 0;
  char message[256] = {};
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::vector<uint8_t> raw;         // interlaced: the whole image; else one row
  std::vector<png_bytep> row_ptrs;  // interlaced only
  RgbImage out;
  ~PngContext() {
    if (png) {
      png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    }
  }
};

void png_on_error(png_structp png, png_const_charp msg) {
  auto* c = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(c->message, sizeof c->message, "%s", msg ? msg : "unknown error");
  std::longjmp(png_jmpbuf(png), 1);
}

void png_on_warning(png_structp, png_const_charp) {}

void png_on_read(png_structp png, png_bytep out, size_t n) {
  auto* c = static_cast<PngContext*>(png_get_io_ptr(png));
  if (n > c->data.size() - c->pos) {
    png_error(png, "truncated data (the file ends inside a chunk)");
  }
  std::memcpy(out, c->data.data() + c->pos, n);
  c->pos += n;
}

struct PngLayout {
  int width = 0;
  int color_type = 0;
  int depth = 0;  // 1, 2, 4, 8 or 16; below 8, png_set_packing gives a byte per sample
  png_colorp palette = nullptr;
  int num_palette = 0;
  png_bytep trans_alpha = nullptr;
  int num_trans = 0;
  bool has_gray_key = false;
  uint32_t gray_key = 0;
};

// One decoded row (after libpng's unfiltering and unpacking) into RGB, as Pillow's PNG plugin
// and convert("RGBA") + alpha_composite onto white + convert("RGB") give it.
void png_convert_row(const PngLayout& L, const uint8_t* in, uint8_t* out) {
  const int w = L.width;
  const bool wide = L.depth == 16;
  auto sample = [&](int i) -> uint32_t { return wide ? in[2 * i] : in[i]; };  // high byte
  switch (L.color_type) {
    case PNG_COLOR_TYPE_GRAY: {
      // Pillow: 1/2/4-bit gray is scaled to 8 bits (x255, x85, x17), 16-bit is mode I and
      // clipped to 255 by the conversion. A tRNS key k is compared, after that conversion, as
      // Pillow's rgbT2rgba does: the opaque pixel (g, g, g, 255) packed in 32 bits against
      // MAKE_UINT32(k, k, k, 255), whose OR-ed bytes make a 16-bit key > 255 match the gray
      // level k & 0xff (measured: gray16.png, whose key 535 makes level 23 transparent).
      const uint32_t scale = L.depth == 1 ? 255 : L.depth == 2 ? 85 : L.depth == 4 ? 17 : 1;
      const uint32_t k = L.gray_key;
      const uint32_t key = k | k << 8 | k << 16 | 0xffu << 24;
      for (int x = 0; x < w; ++x) {
        uint32_t g = wide ? std::min<uint32_t>(uint32_t{in[2 * x]} << 8 | in[2 * x + 1], 255)
                          : in[x] * scale;
        if (L.has_gray_key && (g * 0x010101u | 0xffu << 24) == key) {
          g = 255;  // transparent: the white background
        }
        out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = static_cast<uint8_t>(g);
      }
      break;
    }
    case PNG_COLOR_TYPE_RGB:  // Pillow keeps RGB as it is: a tRNS key is ignored
      for (int x = 0; x < w; ++x) {
        for (int c = 0; c < 3; ++c) {
          out[3 * x + c] = static_cast<uint8_t>(sample(3 * x + c));
        }
      }
      break;
    case PNG_COLOR_TYPE_PALETTE:
      for (int x = 0; x < w; ++x) {
        int i = in[x];
        uint32_t a = i < L.num_trans ? L.trans_alpha[i] : 255;
        png_color c = i < L.num_palette ? L.palette[i] : png_color{0, 0, 0};
        out[3 * x] = over_white(c.red, a);
        out[3 * x + 1] = over_white(c.green, a);
        out[3 * x + 2] = over_white(c.blue, a);
      }
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      for (int x = 0; x < w; ++x) {
        uint8_t g = over_white(sample(2 * x), sample(2 * x + 1));
        out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = g;
      }
      break;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      for (int x = 0; x < w; ++x) {
        uint32_t a = sample(4 * x + 3);
        for (int c = 0; c < 3; ++c) {
          out[3 * x + c] = over_white(sample(4 * x + c), a);
        }
      }
      break;
  }
}

// All libpng calls; returns false with c->message set on a libpng error.
bool png_run(PngContext* c) {
  c->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, c, png_on_error, png_on_warning);
  if (!c->png) {
    std::snprintf(c->message, sizeof c->message, "libpng could not start");
    return false;
  }
  c->info = png_create_info_struct(c->png);
  if (!c->info) {
    std::snprintf(c->message, sizeof c->message, "libpng could not start");
    return false;
  }
  if (setjmp(png_jmpbuf(c->png))) {
    return false;
  }
  png_set_read_fn(c->png, c, png_on_read);
  png_set_user_limits(c->png, kMaxImageSide, kMaxImageSide);
  png_read_info(c->png, c->info);
  png_uint_32 w = 0, h = 0;
  int depth = 0, color_type = 0, interlace = 0;
  png_get_IHDR(c->png, c->info, &w, &h, &depth, &color_type, &interlace, nullptr, nullptr);
  if (w == 0 || h == 0 || w > kMaxImageSide || h > kMaxImageSide ||
      uint64_t{w} * h > static_cast<uint64_t>(kMaxImagePixels)) {
    png_error(c->png, "image size over the limits");  // png_probe checked it already
  }
  PngLayout L;
  L.width = static_cast<int>(w);
  L.color_type = color_type;
  L.depth = depth;
  if (color_type == PNG_COLOR_TYPE_PALETTE) {
    if (!png_get_PLTE(c->png, c->info, &L.palette, &L.num_palette)) {
      png_error(c->png, "palette image without a PLTE chunk");
    }
  }
  if (png_get_valid(c->png, c->info, PNG_INFO_tRNS)) {
    png_color_16p key = nullptr;
    png_get_tRNS(c->png, c->info, &L.trans_alpha, &L.num_trans, &key);
    if (color_type == PNG_COLOR_TYPE_GRAY && key) {
      L.has_gray_key = true;
      L.gray_key = key->gray;
    }
    if (color_type != PNG_COLOR_TYPE_PALETTE) {
      L.trans_alpha = nullptr;
      L.num_trans = 0;
    }
  }
  if (depth < 8) {
    png_set_packing(c->png);
  }
  int passes = png_set_interlace_handling(c->png);
  png_read_update_info(c->png, c->info);
  size_t rowbytes = png_get_rowbytes(c->png, c->info);
  c->out.width = static_cast<int>(w);
  c->out.height = static_cast<int>(h);
  c->out.pixels.resize(size_t{w} * h * 3);
  if (passes > 1) {
    c->raw.resize(rowbytes * h);
    c->row_ptrs.resize(h);
    for (png_uint_32 y = 0; y < h; ++y) {
      c->row_ptrs[y] = c->raw.data() + y * rowbytes;
    }
    png_read_image(c->png, c->row_ptrs.data());
    for (png_uint_32 y = 0; y < h; ++y) {
      png_convert_row(L, c->row_ptrs[y], c->out.pixels.data() + size_t{y} * w * 3);
    }
  } else {
    c->raw.resize(rowbytes);
    for (png_uint_32 y = 0; y < h; ++y) {
      png_read_row(c->png, c->raw.data(), nullptr);
      png_convert_row(L, c->raw.data(), c->out.pixels.data() + size_t{y} * w * 3);
    }
  }
  return true;
}

RgbImage png_decode(std::span<const uint8_t> bytes) {
  png_probe(bytes);
  auto c = std::make_unique<PngContext>();
  c->data = bytes;
  if (!png_run(c.get())) {
    fail("image: malformed PNG: {}", c->message);
  }
  return std::move(c->out);
}

// --- JPEG ------------------------------------------------------------------------------------

constexpr int kMaxJpegScans = 1000;  // progressive files with endless scans cost time, not data

struct JpegContext {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  jpeg_progress_mgr progress{};
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64] = {};
  std::vector<uint8_t> row;
  RgbImage out;
  ~JpegContext() { jpeg_destroy_decompress(&cinfo); }  // a no-op before jpeg_create_decompress
};

JpegContext* jpeg_context(j_common_ptr cinfo) {
  return static_cast<JpegContext*>(cinfo->client_data);
}

void jpeg_on_error(j_common_ptr cinfo) {
  JpegContext* c = jpeg_context(cinfo);
  char buf[JMSG_LENGTH_MAX] = {};
  (*cinfo->err->format_message)(cinfo, buf);
  std::snprintf(c->message, sizeof c->message, "%s", buf);
  std::longjmp(c->jump, 1);
}

// Warnings (level -1) are corrupt-data notes libjpeg recovers from, as Pillow does, except the
// end of the data inside the image: libjpeg would fill the rest with gray, Pillow reports the
// file as truncated.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0) {
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
      JpegContext* c = jpeg_context(cinfo);
      std::snprintf(c->message, sizeof c->message,
                    "truncated data (the file ends before the image does)");
      std::longjmp(c->jump, 1);
    }
    cinfo->err->num_warnings++;
  }
}

void jpeg_on_output(j_common_ptr) {}

void jpeg_on_progress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxJpegScans) {
    JpegContext* c = jpeg_context(cinfo);
    std::snprintf(c->message, sizeof c->message, "more than %d scans", kMaxJpegScans);
    std::longjmp(c->jump, 1);
  }
}

// All libjpeg calls; returns false with c->message set on an error. header_only stops after the
// header (probe_image).
bool jpeg_run(JpegContext* c, std::span<const uint8_t> bytes, bool header_only) {
  c->cinfo.err = jpeg_std_error(&c->err);
  c->cinfo.client_data = c;
  c->err.error_exit = jpeg_on_error;
  c->err.emit_message = jpeg_on_message;
  c->err.output_message = jpeg_on_output;
  if (setjmp(c->jump)) {
    return false;
  }
  jpeg_create_decompress(&c->cinfo);  // keeps err and client_data
  c->progress.progress_monitor = jpeg_on_progress;
  c->cinfo.progress = &c->progress;
  jpeg_mem_src(&c->cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&c->cinfo, TRUE);
  j_decompress_ptr d = &c->cinfo;
  if (d->image_width == 0 || d->image_height == 0 || d->image_width > kMaxImageSide ||
      d->image_height > kMaxImageSide ||
      uint64_t{d->image_width} * d->image_height > static_cast<uint64_t>(kMaxImagePixels)) {
    return true;  // the caller reports the size
  }
  switch (d->jpeg_color_space) {
    case JCS_GRAYSCALE:
      d->out_color_space = JCS_GRAYSCALE;
      break;
    case JCS_YCbCr:
    case JCS_RGB:
      d->out_color_space = JCS_RGB;
      break;
    default:
      std::snprintf(c->message, sizeof c->message,
                    "%s colour space (%d components) is not supported",
                    d->jpeg_color_space == JCS_CMYK   ? "CMYK"
                    : d->jpeg_color_space == JCS_YCCK ? "YCCK"
                                                      : "an unknown",
                    d->num_components);
      return false;
  }
  if (header_only) {
    return true;
  }
  jpeg_start_decompress(d);
  const int w = static_cast<int>(d->output_width), h = static_cast<int>(d->output_height);
  const int comps = d->output_components;
  c->out.width = w;
  c->out.height = h;
  c->out.pixels.resize(size_t(w) * h * 3);
  c->row.resize(size_t(w) * comps);
  while (d->output_scanline < d->output_height) {
    JSAMPROW rows[1] = {c->row.data()};
    int y = static_cast<int>(d->output_scanline);
    if (jpeg_read_scanlines(d, rows, 1) != 1) {
      std::snprintf(c->message, sizeof c->message, "truncated data");
      return false;
    }
    uint8_t* out = c->out.pixels.data() + size_t(y) * w * 3;
    if (comps == 1) {
      for (int x = 0; x < w; ++x) {
        out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = c->row[x];
      }
    } else {
      std::memcpy(out, c->row.data(), size_t(w) * 3);
    }
  }
  // No jpeg_finish_decompress: what follows the last scan line (up to EOI) is not needed.
  return true;
}

RgbImage jpeg_decode(std::span<const uint8_t> bytes, ImageInfo* info) {
  auto c = std::make_unique<JpegContext>();
  if (!jpeg_run(c.get(), bytes, info != nullptr)) {
    fail("image: malformed JPEG: {}", c->message);
  }
  check_size("JPEG", c->cinfo.image_width, c->cinfo.image_height);
  if (info) {
    *info = {ImageFormat::kJpeg, static_cast<int>(c->cinfo.image_width),
             static_cast<int>(c->cinfo.image_height)};
  }
  return std::move(c->out);
}

// --- resize ----------------------------------------------------------------------------------

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's 8-bit resample precision

double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) {
    return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  }
  if (x < 2.0) {
    return (((x - 5) * x + 8) * x - 4) * a;
  }
  return 0.0;
}

// The taps of one output axis: for output i, inputs [first[i], first[i] + count[i]) with
// fixed-point weights k[i * ksize + j] (Pillow's precompute_coeffs + normalize_coeffs_8bpc).
struct Taps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> k;
};

Taps make_taps(int in_size, int out_size) {
  constexpr double support_base = 2.0;  // bicubic
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = support_base * filterscale;
  Taps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.k.assign(size_t(out_size) * t.ksize, 0);
  std::vector<double> w(t.ksize);
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    int n = hi - lo;
    double sum = 0.0;
    for (int j = 0; j < n; ++j) {
      w[j] = bicubic((j + lo - center + 0.5) * ss);
      sum += w[j];
    }
    for (int j = 0; j < n; ++j) {
      double v = sum != 0.0 ? w[j] / sum : w[j];
      double f = v * (1 << kPrecisionBits);
      t.k[size_t(i) * t.ksize + j] = static_cast<int32_t>(v < 0 ? f - 0.5 : f + 0.5);
    }
    t.first[i] = lo;
    t.count[i] = n;
  }
  return t;
}

inline uint8_t clip8(int32_t acc) {
  int32_t v = acc >> kPrecisionBits;  // arithmetic shift, as Pillow's
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

}  // namespace

ImageInfo probe_image(std::span<const uint8_t> bytes) {
  if (detect_format(bytes) == ImageFormat::kPng) {
    return png_probe(bytes);
  }
  ImageInfo info;
  jpeg_decode(bytes, &info);
  return info;
}

RgbImage decode_image(std::span<const uint8_t> bytes) {
  if (detect_format(bytes) == ImageFormat::kPng) {
    return png_decode(bytes);
  }
  return jpeg_decode(bytes, nullptr);
}

RgbImage resize_bicubic(const RgbImage& in, int width, int height) {
  ATOM_CHECK(width > 0 && height > 0 && in.width > 0 && in.height > 0, "resize {}x{} -> {}x{}",
             in.width, in.height, width, height);
  ATOM_CHECK(in.pixels.size() == size_t(in.width) * in.height * 3, "RGB image of {} bytes",
             in.pixels.size());
  RgbImage cur = in;
  if (width != in.width) {  // horizontal pass
    Taps t = make_taps(in.width, width);
    RgbImage out{width, cur.height, std::vector<uint8_t>(size_t(width) * cur.height * 3)};
    for (int y = 0; y < cur.height; ++y) {
      const uint8_t* src = cur.pixels.data() + size_t(y) * cur.width * 3;
      uint8_t* dst = out.pixels.data() + size_t(y) * width * 3;
      for (int x = 0; x < width; ++x) {
        const int32_t* k = t.k.data() + size_t(x) * t.ksize;
        const uint8_t* s = src + size_t(t.first[x]) * 3;
        int32_t a0 = 1 << (kPrecisionBits - 1), a1 = a0, a2 = a0;
        for (int j = 0; j < t.count[x]; ++j) {
          a0 += s[3 * j] * k[j];
          a1 += s[3 * j + 1] * k[j];
          a2 += s[3 * j + 2] * k[j];
        }
        dst[3 * x] = clip8(a0);
        dst[3 * x + 1] = clip8(a1);
        dst[3 * x + 2] = clip8(a2);
      }
    }
    cur = std::move(out);
  }
  if (height != in.height) {  // vertical pass, on the horizontally resampled rows
    Taps t = make_taps(in.height, height);
    const int w = cur.width;
    RgbImage out{w, height, std::vector<uint8_t>(size_t(w) * height * 3)};
    for (int y = 0; y < height; ++y) {
      const int32_t* k = t.k.data() + size_t(y) * t.ksize;
      uint8_t* dst = out.pixels.data() + size_t(y) * w * 3;
      for (int i = 0; i < w * 3; ++i) {
        int32_t acc = 1 << (kPrecisionBits - 1);
        for (int j = 0; j < t.count[y]; ++j) {
          acc += cur.pixels[(size_t(t.first[y] + j) * w) * 3 + i] * k[j];
        }
        dst[i] = clip8(acc);
      }
    }
    cur = std::move(out);
  }
  return cur;
}

ResizePlan navit_resize(int width, int height, const ProcessorParams& p) {
  ATOM_CHECK(width > 0 && height > 0, "image size {} x {}", width, height);
  ATOM_CHECK(p.patch_size > 0 && p.merge_kernel_size > 0 && p.in_patch_limit > 0 &&
                 p.patch_limit_on_one_side > 0,
             "processor parameters patch_size {}, merge_kernel_size {}, in_patch_limit {}, "
             "patch_limit_on_one_side {}",
             p.patch_size, p.merge_kernel_size, p.in_patch_limit, p.patch_limit_on_one_side);
  // transformers' navit_resize in double precision, as Python computes it. Width goes with
  // width: transformers' Kimi_K25ImageProcessor._preprocess calls navit_resize(height, width)
  // on a function declared (width, height), which swaps the axes of non-square images; the
  // Kimi-K2.5 remote-code processor and vLLM keep the aspect ratio, and so does this.
  const double npw = std::max(1.0, static_cast<double>(width / p.patch_size));
  const double nph = std::max(1.0, static_cast<double>(height / p.patch_size));
  const double side = static_cast<double>(p.patch_limit_on_one_side) * p.patch_size;
  const double scale =
      std::min({1.0, std::sqrt(static_cast<double>(p.in_patch_limit) / (npw * nph)), side / width,
                side / height});
  const int max_side = p.patch_limit_on_one_side * p.patch_size;
  ResizePlan r;
  r.resized_width = std::min(std::max(1, static_cast<int>(width * scale)), max_side);
  r.resized_height = std::min(std::max(1, static_cast<int>(height * scale)), max_side);
  const int f = p.merge_kernel_size * p.patch_size;
  r.padded_width = (r.resized_width + f - 1) / f * f;
  r.padded_height = (r.resized_height + f - 1) / f * f;
  return r;
}

ImageGrid image_grid(int width, int height, const ProcessorParams& p) {
  ResizePlan r = navit_resize(width, height, p);
  return {1, r.padded_height / p.patch_size, r.padded_width / p.patch_size};
}

int64_t num_image_tokens(const ImageGrid& g, const ProcessorParams& p) {
  return g.num_patches() / (int64_t{p.merge_kernel_size} * p.merge_kernel_size);
}

VisionInput preprocess_image(const RgbImage& image, const ProcessorParams& p) {
  ResizePlan r = navit_resize(image.width, image.height, p);
  RgbImage resized;
  const RgbImage* src = &image;
  if (r.resized_width != image.width || r.resized_height != image.height) {
    resized = resize_bicubic(image, r.resized_width, r.resized_height);
    src = &resized;
  }
  // Normalised values of every uint8 level: transformers fuses rescale and normalise into
  // (x - mean / rescale) / (std / rescale) in float32, i.e. (x - 127.5) / 127.5 here. Padding
  // is 0 in uint8, so -mean/std after normalising.
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    const float mean = static_cast<float>(p.image_mean[c] * 255.0);
    const float std = static_cast<float>(p.image_std[c] * 255.0);
    for (int v = 0; v < 256; ++v) {
      lut[c][v] = (static_cast<float>(v) - mean) / std;
    }
  }
  const int ps = p.patch_size;
  VisionInput out;
  out.grid = {1, r.padded_height / ps, r.padded_width / ps};
  out.num_tokens = num_image_tokens(out.grid, p);
  out.pixel_values.resize(size_t(out.grid.num_patches()) * 3 * ps * ps);
  float* dst = out.pixel_values.data();
  for (int64_t gi = 0; gi < out.grid.h; ++gi) {
    for (int64_t gj = 0; gj < out.grid.w; ++gj) {
      for (int c = 0; c < 3; ++c) {
        for (int py = 0; py < ps; ++py) {
          const int64_t y = gi * ps + py;
          for (int px = 0; px < ps; ++px) {
            const int64_t x = gj * ps + px;
            uint8_t v = 0;
            if (y < src->height && x < src->width) {
              v = src->pixels[(size_t(y) * src->width + x) * 3 + c];
            }
            *dst++ = lut[c][v];
          }
        }
      }
    }
  }
  return out;
}

VisionInput process_image_bytes(std::span<const uint8_t> bytes, const ProcessorParams& params) {
  return preprocess_image(decode_image(bytes), params);
}

}  // namespace atom::vision
