// Images for the vision tower (Kimi-K2.5's MoonViT): untrusted PNG/JPEG bytes -> RGB pixels ->
// the processor's pixel_values and grid, as transformers' Kimi_K25ImageProcessor computes them
// (docs/vision.md). Decoding follows Pillow (Image.open, then transformers' convert_to_rgb), the
// resize is Pillow's antialiased BICUBIC in its fixed-point arithmetic, and every malformed or
// oversized input is an atom::Error naming what is wrong.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace atom::vision {

enum class ImageFormat { kPng, kJpeg };

// Limits checked from the header, before any pixel memory is allocated.
constexpr int kMaxImageSide = 16384;
constexpr int64_t kMaxImagePixels = int64_t{64} << 20;  // 64 Mi pixels

struct ImageInfo {
  ImageFormat format = ImageFormat::kPng;
  int width = 0;
  int height = 0;
};

// 8-bit RGB, row-major, interleaved: pixels[(y * width + x) * 3 + c].
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

// The format (by magic bytes) and size from the header alone; throws for unknown formats,
// malformed headers and sizes over the limits.
ImageInfo probe_image(std::span<const uint8_t> bytes);

// Decodes a PNG (any colour type and bit depth) or a JPEG (grayscale, YCbCr or RGB) into RGB as
// Pillow + transformers' convert_to_rgb do: alpha (PNG alpha channels, palette and gray tRNS) is
// composited onto white with Pillow's integer arithmetic; 16-bit samples keep their high byte
// (16-bit gray is clipped to 255, Pillow's mode I). An RGB PNG's tRNS key is ignored, as Pillow's
// convert_to_rgb returns RGB images unchanged. CMYK JPEGs are refused.
RgbImage decode_image(std::span<const uint8_t> bytes);

// Pillow's Image.resize(size, BICUBIC) on 8-bit RGB: separable (horizontal pass, then vertical),
// kernel a = -0.5 with its support widened by the downscale factor, 22-bit fixed-point
// coefficients and a rounding to uint8 between the passes. A pass whose size does not change is
// skipped (the same size gives a copy).
RgbImage resize_bicubic(const RgbImage& image, int width, int height);

// The processor's parameters, with Kimi-K2.5's defaults (preprocessor_config.json's
// media_proc_cfg: patch_size, merge_kernel_size, in_patch_limit, patch_limit_on_one_side).
struct ProcessorParams {
  int patch_size = 14;
  int merge_kernel_size = 2;
  int64_t in_patch_limit = 16384;     // transformers' max_patches
  int patch_limit_on_one_side = 512;  // transformers' size.max_height == size.max_width
  float image_mean[3] = {0.5f, 0.5f, 0.5f};
  float image_std[3] = {0.5f, 0.5f, 0.5f};
};

struct ResizePlan {
  int resized_width = 0;
  int resized_height = 0;
  int padded_width = 0;  // a multiple of patch_size * merge_kernel_size
  int padded_height = 0;
};

// navit_resize: the size the image is resized to (never larger) and padded to.
ResizePlan navit_resize(int width, int height, const ProcessorParams& params);

struct ImageGrid {
  int64_t t = 1;
  int64_t h = 0;  // patches down
  int64_t w = 0;  // patches across
  int64_t num_patches() const { return t * h * w; }
};

// The grid for an image of this size, without its pixels (vLLM's get_number_of_image_patches).
ImageGrid image_grid(int width, int height, const ProcessorParams& params);
// Text placeholder tokens for a grid: h * w / merge_kernel_size^2.
int64_t num_image_tokens(const ImageGrid& grid, const ProcessorParams& params);

struct VisionInput {
  // F32 [num_patches, 3, patch_size, patch_size]: patch (i, j) at i * grid.w + j, each channel
  // by channel, then rows, then columns.
  std::vector<float> pixel_values;
  ImageGrid grid;
  int64_t num_tokens = 0;
  std::array<int64_t, 3> grid_thw() const { return {grid.t, grid.h, grid.w}; }
};

// resize (navit_resize's size), pad bottom and right with zeros, rescale by 1/255, normalise,
// cut into patches.
VisionInput preprocess_image(const RgbImage& image, const ProcessorParams& params = {});
// decode_image then preprocess_image.
VisionInput process_image_bytes(std::span<const uint8_t> bytes, const ProcessorParams& params = {});

}  // namespace atom::vision
