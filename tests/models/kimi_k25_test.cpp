// Kimi-K2.5 (KimiK25ForConditionalGeneration): the MoonViT vision tower, its patchmerger
// projector and the DeepSeek-V3 text model with the image features at the placeholder tokens.
// References:
//   - kimi_k25 (tools/moonvit_reference.py, this machine's PyTorch): the tower and projector
//     written from the checkpoint's definition with torch's ops, on two images (an 8 x 8 grid and
//     a 2 x 6 one, so the 4 x 4 position grid is resized up, and down in one direction); the text
//     model is the deepseek_v3 fixture's, whose transformers references hold for it;
//   - kimi_k25_hf (tools/make_vision_fixture.py on the GPU machine): transformers'
//     Kimi_K25ForConditionalGeneration end to end, logits and greedy tokens with the images.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "common/fixtures.h"
#include "common/reference_images.h"
#include "engine/sequence_runner.h"
#include "models/loading.h"
#include "models/moonvit.h"

namespace atom::test {
namespace {

// Measured on 2026-12-07 (this machine, fp32 against torch's fp32): the resize 2.2e-6, the tower
// 2.0e-6, the projector 1.9e-6.
constexpr float kResizeTolerance = 1e-5f;
constexpr float kVisionTolerance = 1e-5f;

// transformers' own Kimi_K25 (kimi_k25_hf, fp32 on the CPU of the GPU machine, 2026-12-07): the
// tower 2.7e-4 and the projector 1.0e-4 from atom, the logits with the images 4.3e-4, greedy
// tokens identical, where atom and tools/moonvit_reference.py agree to 2e-6 on the same weights
// and inputs (transformers' run on the GPU gave 2.2e-4: the gap is systematic, its cause not yet
// found; its bicubic weights and rotary layout were read and equal torch's).
constexpr float kTransformersVisionTolerance = 1e-3f;
constexpr float kTransformersLogitTolerance = 1e-3f;

struct VisionRef {
  SafetensorsFile file;
  Tensor pixel_values;
  std::vector<ImageGrid> grids;
  std::vector<int32_t> input_ids, greedy;
  explicit VisionRef(const std::string& name)
      : file(source_dir() + "/tests/fixtures/references/" + name + ".safetensors",
             /*use_mmap=*/true) {
    ReferenceImages r = reference_images(file);
    pixel_values = r.pixel_values;
    grids = r.grids;
    if (name == "kimi_k25_hf") {
      input_ids = ids_of(file.tensor("input_ids"));
      greedy = ids_of(file.tensor("greedy"));
    }
  }
  Tensor get(const char* name) { return file.tensor(name).clone(); }
};

// `v`'s last hidden state and projected features of `ref`'s images against the reference's,
// each within `tol`; prints both differences after `what`.
void expect_tower_matches(VisionEncoder& v, VisionRef& ref, float tol, const std::string& what) {
  const float dh = expect_logits_near(v.encode_hidden(ref.pixel_values, ref.grids),
                                      ref.get("vision_hidden"), tol, what + ", last hidden state");
  const float de = expect_logits_near(v.encode(ref.pixel_values, ref.grids),
                                      ref.get("image_embeds"), tol, what + ", projected features");
  std::printf("%s: max |Δ| tower %.3g, projector %.3g\n", what.c_str(), dh, de);
}

// The image placeholders of `ids` as runs over the rows of `features`, in order.
InputEmbeds placeholder_embeds(const std::vector<int32_t>& ids, int64_t image_token,
                               const Tensor& features) {
  InputEmbeds e;
  int64_t src = 0;
  for (size_t i = 0; i < ids.size();) {
    if (ids[i] != image_token) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < ids.size() && ids[j] == image_token) ++j;
    e.runs.push_back(
        {static_cast<int64_t>(i), features.narrow(0, src, static_cast<int64_t>(j - i))});
    src += static_cast<int64_t>(j - i);
    i = j;
  }
  EXPECT_EQ(src, features.size(0)) << "placeholders and image features differ in number";
  return e;
}

TEST(MoonVit, BicubicResizeMatchesTorch) {
  VisionRef ref("kimi_k25_torch");
  const Tensor src = ref.get("resize_src");
  const Tensor up = ref.get("resize_up"), down = ref.get("resize_down");
  const float du = expect_logits_near(bicubic_resize_hwc(src, up.size(0), up.size(1)), up,
                                      kResizeTolerance, "bicubic 5x7 -> 9x12");
  const float dd = expect_logits_near(bicubic_resize_hwc(src, down.size(0), down.size(1)), down,
                                      kResizeTolerance, "bicubic 5x7 -> 3x2");
  std::printf("bicubic resize max |Δ| vs torch: up %.3g, down %.3g\n", du, dd);
}

// tools/moonvit_reference.py: the tower written from the checkpoint's own definition in PyTorch
// (torch's interpolate, layer_norm, GELUs, complex rotation), a reference independent of
// transformers' port.
TEST(KimiK25, VisionTowerAndProjectorMatchTheTorchReference) {
  VisionRef ref("kimi_k25_torch");
  LoadedModel m = model_load(fixture_dir("kimi_k25"), ModelOptions{});
  VisionEncoder* v = m.model->vision_encoder();
  ASSERT_NE(v, nullptr);
  expect_tower_matches(*v, ref, kVisionTolerance, "kimi_k25 vs the torch reference");
}

TEST(KimiK25, VisionTowerAndProjectorMatchTransformers) {
  VisionRef ref("kimi_k25_hf");
  LoadedModel m = model_load(fixture_dir("kimi_k25_hf"), ModelOptions{});
  VisionEncoder* v = m.model->vision_encoder();
  ASSERT_NE(v, nullptr);
  expect_tower_matches(*v, ref, kTransformersVisionTolerance, "kimi_k25 vs transformers");
}

// The same fixture and images against the PyTorch reference in float64
// (tools/moonvit_reference.py OUT float64). transformers' float32 tower is 2.66e-4 (tower) and
// 9.2e-5 (features) from it: the fixture's patch embedding reaches values near 600, where each
// float32 tower's summation order shows; atom's is 8.2e-5 and 4.5e-5 from it.
TEST(KimiK25, VisionTowerAndProjectorMatchAFloat64Reference) {
  VisionRef images("kimi_k25_hf");
  const SafetensorsFile f64(source_dir() + "/tests/fixtures/references/kimi_k25_hf_f64.safetensors",
                            /*use_mmap=*/true);
  LoadedModel m = model_load(fixture_dir("kimi_k25_hf"), ModelOptions{});
  VisionEncoder* v = m.model->vision_encoder();
  ASSERT_NE(v, nullptr);
  const float dh = expect_logits_near(v->encode_hidden(images.pixel_values, images.grids),
                                      f64.tensor("vision_hidden").clone(), 1e-4f,
                                      "kimi_k25_hf vs float64, last hidden state");
  const float de = expect_logits_near(v->encode(images.pixel_values, images.grids),
                                      f64.tensor("image_embeds").clone(), 1e-4f,
                                      "kimi_k25_hf vs float64, projected features");
  std::printf("kimi_k25_hf vs the float64 reference: max |Δ| tower %.3g, projector %.3g\n", dh, de);
}

TEST(KimiK25, LogitsWithImagesMatchTransformers) {
  VisionRef ref("kimi_k25_hf");
  LoadedModel m = model_load(fixture_dir("kimi_k25_hf"), ModelOptions{});
  VisionEncoder* v = m.model->vision_encoder();
  ASSERT_NE(v, nullptr);
  const InputEmbeds e = placeholder_embeds(ref.input_ids, v->image_token_id(),
                                           v->encode(ref.pixel_values, ref.grids));
  ASSERT_EQ(e.runs.size(), ref.grids.size());
  const Tensor want = ref.get("logits");
  const float d =
      expect_logits_near(score_tokens(*m.model, ref.input_ids, 0, 16, std::nullopt, &e), want,
                         kTransformersLogitTolerance, "kimi_k25 logits with images");
  // Chunks of 5 cut the images' runs of placeholders.
  const float d5 =
      expect_logits_near(score_tokens(*m.model, ref.input_ids, 5, 16, std::nullopt, &e), want,
                         kTransformersLogitTolerance, "kimi_k25 logits with images, chunks of 5");
  std::printf("kimi_k25: max |Δlogit| vs transformers %.3g, chunked %.3g\n", d, d5);
  // Without the images the same ids give other logits: the features are what is compared.
  EXPECT_GT(max_abs_diff(score_tokens(*m.model, ref.input_ids), want), 1e-2f);
}

TEST(KimiK25, GreedyWithImagesMatchesTransformers) {
  VisionRef ref("kimi_k25_hf");
  LoadedModel m = model_load(fixture_dir("kimi_k25_hf"), ModelOptions{});
  VisionEncoder* v = m.model->vision_encoder();
  const InputEmbeds e = placeholder_embeds(ref.input_ids, v->image_token_id(),
                                           v->encode(ref.pixel_values, ref.grids));
  const GreedyResult r = generate_greedy(
      *m.model, ref.input_ids, static_cast<int>(ref.greedy.size()), {}, true, 16, std::nullopt, &e);
  EXPECT_EQ(r.token_ids, ref.greedy);
}

// The text model under the checkpoint's language_model.* names is deepseek_v3's: transformers'
// logits and greedy tokens for it hold.
TEST(KimiK25, TextOnlyMatchesTransformers) {
  const Reference ref = reference_load("deepseek_v3");
  LoadedModel m = model_load(fixture_dir("kimi_k25"), ModelOptions{});
  const float d = expect_cpu_parity(score_tokens(*m.model, ref.input_ids), ref.logits, "kimi_k25",
                                    "kimi_k25 text only");
  std::printf("kimi_k25 text only: max |Δlogit| vs transformers %.3g\n", d);
  EXPECT_EQ(generate_greedy(*m.model, ref.greedy_prompt, static_cast<int>(ref.greedy_tokens.size()),
                            {}, true)
                .token_ids,
            ref.greedy_tokens);
}

// The image features replace exactly the placeholders' embeddings: rows before the first image
// are the text model's, rows from it on change, and chunked prefill (chunks cutting the images'
// runs) gives the same logits.
TEST(KimiK25, ImageFeaturesReplaceThePlaceholderEmbeddings) {
  VisionRef ref("kimi_k25_torch");
  LoadedModel m = model_load(fixture_dir("kimi_k25"), ModelOptions{});
  VisionEncoder* v = m.model->vision_encoder();
  ASSERT_NE(v, nullptr);
  const int32_t img = static_cast<int32_t>(v->image_token_id());
  std::vector<int32_t> ids = {0, 11, 12, 13, 14, 15, 16, 17, 18};
  const int first = static_cast<int>(ids.size());
  ids.insert(ids.end(), static_cast<size_t>(v->tokens_for(ref.grids[0])), img);
  for (int32_t t : {21, 22, 23}) ids.push_back(t);
  ids.insert(ids.end(), static_cast<size_t>(v->tokens_for(ref.grids[1])), img);
  for (int32_t t : {31, 32, 33, 34, 35, 36, 37}) ids.push_back(t);
  const InputEmbeds e = placeholder_embeds(ids, img, v->encode(ref.pixel_values, ref.grids));
  const Tensor with = score_tokens(*m.model, ids, 0, 16, std::nullopt, &e);
  const Tensor without = score_tokens(*m.model, ids);
  const int64_t V = m.model->vocab_size();
  EXPECT_LE(max_abs_diff(with.narrow(0, 0, first), without.narrow(0, 0, first)), 0.0f);
  EXPECT_GT(max_abs_diff(with.narrow(0, first, static_cast<int64_t>(ids.size()) - first),
                         without.narrow(0, first, static_cast<int64_t>(ids.size()) - first)),
            1e-2f);
  const float d = expect_logits_near(score_tokens(*m.model, ids, 5, 16, std::nullopt, &e), with,
                                     1e-5f, "kimi_k25 with images, chunks of 5");
  std::printf("kimi_k25: chunked vs whole prefill with images max |Δlogit| %.3g (vocab %lld)\n", d,
              static_cast<long long>(V));
}

TEST(KimiK25, BadImagesAreRefusedByName) {
  VisionRef ref("kimi_k25_torch");
  LoadedModel m = model_load(fixture_dir("kimi_k25"), ModelOptions{});
  VisionEncoder* v = m.model->vision_encoder();
  auto refused = [&](const Tensor& pix, std::vector<ImageGrid> grids, const std::string& what) {
    try {
      v->encode(pix, grids);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  std::vector<ImageGrid> g = ref.grids;
  g.back().w += 2;
  refused(ref.pixel_values, g, "the grids give");
  g = ref.grids;
  g[0].t = 5;  // more frames than the time table's 4
  refused(ref.pixel_values, g, "frames");
  refused(ref.pixel_values, {{1, 3, 4}}, "multiple of the 2x2 merge");
  refused(ref.pixel_values, {}, "no images");
  refused(ref.pixel_values.view({-1, 3, 7, 28}), ref.grids, "pixel_values must be");
  // Embedding rows past the prompt, or of another width, are refused by name.
  const std::vector<int32_t> ids = {0, 11, 12, 13, 14, 15};
  const int64_t H = m.model->config().hidden_size;
  InputEmbeds past;
  past.runs.push_back({4, Tensor::zeros({4, H}, DType::kF32)});
  try {
    score_tokens(*m.model, ids, 0, 16, std::nullopt, &past);
    ADD_FAILURE() << "rows past the prompt were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fall outside"), std::string::npos) << e.what();
  }
  InputEmbeds narrow;
  narrow.runs.push_back({1, Tensor::zeros({2, H - 1}, DType::kF32)});
  try {
    score_tokens(*m.model, ids, 0, 16, std::nullopt, &narrow);
    ADD_FAILURE() << "rows of another width were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit"), std::string::npos) << e.what();
  }
}

// Videos through K2.5's tower beside an image: 3 frames of 4 x 6 and 2 of 2 x 4 (frames attend
// to each other, the fixed time table on each frame, the merge's mean over frames), against
// tools/moonvit_reference.py's forward; a video gives as many tokens as one of its frames.
TEST(KimiK25, VideosMatchTheTorchReference) {
  VisionRef ref("kimi_k25_video_torch");
  LoadedModel m = model_load(fixture_dir("kimi_k25"), ModelOptions{});
  VisionEncoder* v = m.model->vision_encoder();
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(ref.grids.size(), 3u);
  EXPECT_EQ(ref.grids[0].t, 3);
  EXPECT_EQ(v->tokens_for(ref.grids[0]), 6);
  expect_tower_matches(*v, ref, kVisionTolerance, "kimi_k25 videos vs the torch reference");
}

// Kimi-K3's MoonViT3d (RMSNorms at bf16's machine epsilon, no biases, the position grid resized
// bilinearly) and patchmergerv2 in the kimi_k3 fixture, against tools/moonvit_reference.py's
// forward with the same options; the text model of that fixture is checked by the hybrid parity
// tests. Measured 2026-12-07: see the printout.
TEST(KimiK3Vision, TowerAndProjectorMatchTheTorchReference) {
  VisionRef ref("kimi_k3_vision_torch");
  LoadedModel m = model_load(fixture_dir("kimi_k3"), ModelOptions{});
  VisionEncoder* v = m.model->vision_encoder();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->image_token_id(), 511);  // media_placeholder_token_id
  expect_tower_matches(*v, ref, kVisionTolerance, "kimi_k3 vs the torch reference");
  // A K3 config without a described tower (kimi_k3_mxfp4's) loads the text model alone.
  LoadedModel t = model_load(fixture_dir("kimi_k3_mxfp4"), ModelOptions{});
  EXPECT_EQ(t.model->vision_encoder(), nullptr);
}

}  // namespace
}  // namespace atom::test
