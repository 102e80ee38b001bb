// Images in a prompt, as the engine keeps them from add_request to the request's end (the spec's
// input processing): each image's single placeholder token is expanded to the number of feature
// rows the model's vision tower gives it, so the scheduler, KV blocks and positions see the true
// prompt length; the features are computed once, at add_request, and written over the
// placeholders' embeddings whenever those rows are computed (Batch::input_embeds, also after a
// preemption); block hashes mix in each image's content hash, so two prompts with the same
// tokens and other images never share cached blocks. A prompt with images is prefilled in one
// step (never chunked).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"
#include "layers/batch.h"
#include "vision/image.h"

namespace atom {

class VisionEncoder;

// One image of a request: the image processor's output (vision::VisionInput's values).
struct PromptImage {
  Tensor pixel_values;  // [grid.num_patches(), 3, patch, patch] F32 on the CPU
  vision::ImageGrid grid;
};

struct RequestImages {
  struct Placed {
    int start = 0;        // first placeholder token in the expanded prompt
    int tokens = 0;       // placeholder tokens (feature rows)
    int feature_row = 0;  // its first row of `features`
    uint64_t hash = 0;    // of its pixel values and grid
  };
  std::vector<Placed> images;  // in prompt order
  Tensor features;             // [sum of tokens, hidden] on the CPU, F32 or the tower's BF16/F16
};

// The features of recent images by content, so that an image sent again (a chat resends its
// images with every turn) skips the vision tower, as vLLM's multimodal cache
// (--mm-processor-cache-gb) does. Entries hold the features and the pixel values they came from:
// the 64-bit content hash finds a candidate, and a hit must have the same grid and the same pixel
// bytes (a crafted hash collision gets its own features, never another image's). At most
// `max_bytes` of both, least recently used out first (an entry larger than the budget is not
// kept; 0 keeps nothing). Thread-safe.
class ImageFeatureCache {
 public:
  explicit ImageFeatureCache(int64_t max_bytes) : max_bytes_(max_bytes) {}
  // The cached features of this image, or an undefined tensor.
  Tensor find(uint64_t hash, const PromptImage& image);
  void insert(uint64_t hash, const PromptImage& image, const Tensor& features);
  int64_t hits() const;
  size_t size() const;

 private:
  struct Entry {
    uint64_t hash;
    vision::ImageGrid grid;
    Tensor pixels, features;  // pixels contiguous
    int64_t bytes;
    // Whether this entry is `image`'s: hash, grid and pixel bytes all equal.
    bool holds(uint64_t h, const PromptImage& image) const;
  };
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  int64_t max_bytes_, bytes_ = 0, hits_ = 0;
};

// Expands each of `prompt`'s image placeholder tokens (the encoder's image_token_id, one per
// image, in order) to its image's feature rows and computes the features: in one tower call for
// the images `cache` (when given) does not hold, which it then keeps. An error names what does
// not fit: a placeholder count other than the image count, a pixel_values shape other than the
// grid's, an image the tower refuses.
std::shared_ptr<const RequestImages> prompt_images_expand(VisionEncoder& encoder,
                                                          std::vector<int32_t>& prompt,
                                                          const std::vector<PromptImage>& images,
                                                          ImageFeatureCache* cache = nullptr);

// Checks that `images` fit `prompt` (expanded): each image's run of placeholder tokens
// (`image_token`) inside the prompt, in order and apart, its feature rows in order, no other
// placeholder in the prompt, features [sum of tokens, hidden] F32/BF16/F16 on the CPU; an error
// naming the first misfit.
void prompt_images_check(const RequestImages& images, const std::vector<int32_t>& prompt,
                         int64_t image_token, int64_t hidden);

// The image features of tokens [start, end) of a sequence whose rows begin at batch row `row0`,
// appended to `e` (created when null).
void prompt_images_embeds(const RequestImages& images, int start, int end, int row0,
                          std::shared_ptr<InputEmbeds>& e);

// `h` (a block's hash) mixed with the images whose placeholders fall in tokens [start, end).
uint64_t prompt_images_hash(const RequestImages& images, uint64_t h, int start, int end);

}  // namespace atom
