#include "engine/multimodal.h"

#define XXH_STATIC_LINKING_ONLY  // XXH64_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "models/moonvit.h"

namespace atom {

bool ImageFeatureCache::Entry::holds(uint64_t h, const PromptImage& image) const {
  if (hash != h || grid.t != image.grid.t || grid.h != image.grid.h || grid.w != image.grid.w ||
      pixels.shape() != image.pixel_values.shape() || pixels.dtype() != image.pixel_values.dtype())
    return false;
  const Tensor p = image.pixel_values.contiguous();
  return std::memcmp(pixels.data(), p.data(), p.nbytes()) == 0;
}

Tensor ImageFeatureCache::find(uint64_t hash, const PromptImage& image) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (!it->holds(hash, image)) continue;
    lru_.splice(lru_.begin(), lru_, it);
    ++hits_;
    return lru_.front().features;
  }
  return Tensor();
}

void ImageFeatureCache::insert(uint64_t hash, const PromptImage& image, const Tensor& features) {
  const int64_t bytes = static_cast<int64_t>(image.pixel_values.nbytes() + features.nbytes()) + 256;
  if (bytes > max_bytes_) return;
  // Its own copies: the request's buffers may be views of larger ones.
  Entry e{hash, image.grid, image.pixel_values.contiguous().clone(), features.contiguous().clone(),
          bytes};
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& o : lru_)
    if (o.holds(hash, image)) return;  // another request put it there meanwhile
  while (!lru_.empty() && bytes_ + bytes > max_bytes_) {
    bytes_ -= lru_.back().bytes;
    lru_.pop_back();
  }
  bytes_ += bytes;
  lru_.push_front(std::move(e));
}

int64_t ImageFeatureCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}
size_t ImageFeatureCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

std::shared_ptr<const RequestImages> prompt_images_expand(VisionEncoder& encoder,
                                                          std::vector<int32_t>& prompt,
                                                          const std::vector<PromptImage>& images,
                                                          ImageFeatureCache* cache) {
  const int64_t tok = encoder.image_token_id();
  const auto placeholders = std::count(prompt.begin(), prompt.end(), static_cast<int32_t>(tok));
  if (placeholders != static_cast<int64_t>(images.size()))
    fail("the prompt has {} image placeholder tokens (id {}) for {} images; each image needs "
         "exactly one",
         placeholders, tok, images.size());
  if (images.empty()) fail("a prompt with images needs at least one image");
  auto out = std::make_shared<RequestImages>();
  int64_t rows = 0, values = -1;
  for (size_t i = 0; i < images.size(); ++i) {
    const PromptImage& im = images[i];
    const Tensor& p = im.pixel_values;
    if (!p.defined() || p.dim() != 4 || p.dtype() != DType::kF32 || !p.device().is_cpu() ||
        p.size(0) != im.grid.num_patches() || p.size(1) != 3 || p.size(2) != p.size(3) ||
        (values >= 0 && p.size(2) != values))
      fail("image {}: pixel_values {} do not fit its grid {}x{}x{}", i,
           p.defined() ? p.str() : std::string("(none)"), im.grid.t, im.grid.h, im.grid.w);
    values = p.size(2);
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
  // The cached images' features, then those of every other image in one tower call.
  std::vector<Tensor> feats(images.size());
  Tensor f;  // the tower's output for the images not cached
  std::vector<size_t> todo;
  int64_t todo_patches = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    if (cache) feats[i] = cache->find(out->images[i].hash, images[i]);
    if (!feats[i].defined()) {
      todo.push_back(i);
      todo_patches += images[i].pixel_values.size(0);
    }
  }
  if (!todo.empty()) {
    Tensor pix = Tensor::empty({todo_patches, 3, values, values}, DType::kF32);
    std::vector<vision::ImageGrid> grids;
    int64_t at = 0, todo_rows = 0;
    for (size_t i : todo) {
      const Tensor c = images[i].pixel_values.contiguous();
      std::memcpy(pix.ptr<float>() + at, c.data(), c.nbytes());
      at += c.numel();
      grids.push_back(images[i].grid);
      todo_rows += out->images[i].tokens;
    }
    f = encoder.encode(pix, grids);
    ATOM_CHECK(f.dim() == 2 && f.size(0) == todo_rows,
               "the vision tower gave {} for {} image tokens", f.str(), todo_rows);
    int64_t r = 0;
    for (size_t i : todo) {
      feats[i] = f.narrow(0, r, out->images[i].tokens);
      r += out->images[i].tokens;
      if (cache) cache->insert(out->images[i].hash, images[i], feats[i]);
    }
  }
  if (todo.size() == images.size()) {
    out->features = f;  // every image from the one call, in order
  } else if (feats.size() == 1) {
    out->features = feats[0];  // (shared with the cache: features are never written)
  } else {
    const int64_t hidden = feats[0].size(1);
    for (const Tensor& f : feats)
      ATOM_CHECK(f.dim() == 2 && f.size(1) == hidden && f.dtype() == feats[0].dtype(),
                 "the vision tower's features {} and {} differ in width or type", f.str(),
                 feats[0].str());
    out->features = Tensor::empty({rows, hidden}, feats[0].dtype());
    int64_t r = 0;
    for (const Tensor& f : feats) {
      out->features.narrow(0, r, f.size(0)).copy_from(f.contiguous());
      r += f.size(0);
    }
  }
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
