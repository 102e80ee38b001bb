#include "engine/multimodal.h"

#define XXH_STATIC_LINKING_ONLY  // XXH64_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "models/moonvit.h"

namespace atom {

std::shared_ptr<const RequestImages> prompt_images_expand(VisionEncoder& encoder,
                                                          std::vector<int32_t>& prompt,
                                                          const std::vector<PromptImage>& images) {
  const int64_t tok = encoder.image_token_id();
  const auto placeholders = std::count(prompt.begin(), prompt.end(), static_cast<int32_t>(tok));
  if (placeholders != static_cast<int64_t>(images.size()))
    fail("the prompt has {} image placeholder tokens (id {}) for {} images; each image needs "
         "exactly one",
         placeholders, tok, images.size());
  auto out = std::make_shared<RequestImages>();
  int64_t patches = 0, rows = 0, values = -1;
  for (size_t i = 0; i < images.size(); ++i) {
    const PromptImage& im = images[i];
    const Tensor& p = im.pixel_values;
    if (!p.defined() || p.dim() != 4 || p.dtype() != DType::kF32 || !p.device().is_cpu() ||
        p.size(0) != im.grid.num_patches() || p.size(1) != 3 || p.size(2) != p.size(3) ||
        (values >= 0 && p.size(2) != values))
      fail("image {}: pixel_values {} do not fit its grid {}x{}x{}", i,
           p.defined() ? p.str() : std::string("(none)"), im.grid.t, im.grid.h, im.grid.w);
    values = p.size(2);
    patches += p.size(0);
  }
  // The expanded prompt.
  std::vector<int32_t> expanded;
  size_t next = 0;
  for (int32_t t : prompt) {
    if (t != tok) {
      expanded.push_back(t);
      continue;
    }
    const PromptImage& im = images[next++];
    const int64_t n = encoder.tokens_for(im.grid);
    if (n <= 0 || n > (int64_t{1} << 20))
      fail("image {}: its grid {}x{}x{} gives {} tokens", next - 1, im.grid.t, im.grid.h, im.grid.w,
           n);
    RequestImages::Placed pl;
    pl.start = static_cast<int>(expanded.size());
    pl.tokens = static_cast<int>(n);
    pl.feature_row = static_cast<int>(rows);
    XXH64_state_t st;
    XXH64_reset(&st, 0x696d616765ull);
    const int64_t g[3] = {im.grid.t, im.grid.h, im.grid.w};
    XXH64_update(&st, g, sizeof(g));
    XXH64_update(&st, im.pixel_values.data(), im.pixel_values.nbytes());
    pl.hash = XXH64_digest(&st);
    out->images.push_back(pl);
    expanded.insert(expanded.end(), static_cast<size_t>(n), t);
    rows += n;
  }
  // The features of every image at once.
  Tensor pix = Tensor::empty({patches, 3, values, values}, DType::kF32);
  std::vector<vision::ImageGrid> grids;
  int64_t at = 0;
  for (const PromptImage& im : images) {
    const Tensor c = im.pixel_values.contiguous();
    std::memcpy(pix.ptr<float>() + at, c.data(), c.nbytes());
    at += c.numel();
    grids.push_back(im.grid);
  }
  out->features = encoder.encode(pix, grids);
  ATOM_CHECK(out->features.dim() == 2 && out->features.size(0) == rows,
             "the vision tower gave {} for {} image tokens", out->features.str(), rows);
  prompt = std::move(expanded);
  return out;
}

void prompt_images_check(const RequestImages& images, const std::vector<int32_t>& prompt,
                         int64_t image_token, int64_t hidden) {
  const Tensor& f = images.features;
  if (!f.defined() || f.dim() != 2 || f.size(1) != hidden ||
      (f.dtype() != DType::kF32 && f.dtype() != DType::kBF16 && f.dtype() != DType::kF16) ||
      !f.device().is_cpu())
    fail("image features {} are not F32, BF16 or F16 [rows, {}] on the CPU",
         f.defined() ? f.str() : std::string("(none)"), hidden);
  const int64_t P = static_cast<int64_t>(prompt.size());
  int64_t end = 0, rows = 0;
  for (size_t i = 0; i < images.images.size(); ++i) {
    const RequestImages::Placed& im = images.images[i];
    if (im.tokens <= 0 || im.start < end || im.start + int64_t{im.tokens} > P ||
        im.feature_row != rows)
      fail("image {}: its {} placeholder tokens at {} (feature row {}) do not fit the {}-token "
           "prompt after the previous image",
           i, im.tokens, im.start, im.feature_row, P);
    for (int t = im.start; t < im.start + im.tokens; ++t)
      if (prompt[static_cast<size_t>(t)] != image_token)
        fail("image {}: prompt token {} is {}, not the image placeholder {}", i, t,
             prompt[static_cast<size_t>(t)], image_token);
    end = im.start + im.tokens;
    rows += im.tokens;
  }
  if (rows != f.size(0)) fail("the images place {} feature rows of {}", rows, f.size(0));
  const auto placeholders =
      std::count(prompt.begin(), prompt.end(), static_cast<int32_t>(image_token));
  if (placeholders != rows)
    fail("the prompt has {} image placeholder tokens and its images fill {}", placeholders, rows);
}

void prompt_images_embeds(const RequestImages& images, int start, int end, int row0,
                          std::shared_ptr<InputEmbeds>& e) {
  for (const RequestImages::Placed& im : images.images) {
    const int lo = std::max(start, im.start), hi = std::min(end, im.start + im.tokens);
    if (lo >= hi) continue;
    if (!e) e = std::make_shared<InputEmbeds>();
    e->runs.push_back(
        {row0 + lo - start, images.features.narrow(0, im.feature_row + lo - im.start, hi - lo)});
  }
}

uint64_t prompt_images_hash(const RequestImages& images, uint64_t h, int start, int end) {
  for (const RequestImages::Placed& im : images.images) {
    if (std::max(start, im.start) >= std::min(end, im.start + im.tokens)) continue;
    const uint64_t mix[3] = {h, im.hash, static_cast<uint64_t>(im.start)};
    h = XXH64(mix, sizeof(mix), 0);
  }
  return h;
}

}  // namespace atom
