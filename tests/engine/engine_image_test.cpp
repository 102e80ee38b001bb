// Prompts with images through the engine (engine/multimodal.h) on Kimi-K2.5's fixture (its tower
// and projector checked against tools/moonvit_reference.py in tests/models/kimi_k25_test.cpp): the
// placeholders expanded at add_request, the features written over their embeddings in whatever
// step computes them, block hashes that tell images apart, one-step prefills, and requests that
// are refused by name while the engine goes on serving.
#include <gtest/gtest.h>

#include <random>

#include "engine_test_util.h"
#include "models/model_group.h"
#include "models/moonvit.h"

namespace atom::test {
namespace {

// A random image on the grid of `like`.
PromptImage random_image(const PromptImage& like, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  PromptImage im{Tensor::empty(like.pixel_values.shape(), DType::kF32), like.grid};
  for (int64_t i = 0; i < im.pixel_values.numel(); ++i) im.pixel_values.ptr<float>()[i] = u(rng);
  return im;
}

// What the single-sequence runner gives for `prompt` (collapsed) with `images`: the reference
// the engine's batching, caching and preemption must not change.
std::vector<int32_t> single(const ImageFixture& x, const std::vector<PromptImage>& images,
                            int tokens) {
  Model& m = fixture_model("kimi_k25");
  std::vector<int32_t> p = x.prompt;
  auto mm = prompt_images_expand(*m.vision_encoder(), p, images);
  std::shared_ptr<InputEmbeds> e;
  prompt_images_embeds(*mm, 0, static_cast<int>(p.size()), 0, e);
  return generate_greedy(m, p, tokens, {}, true, 16, std::nullopt, e.get()).token_ids;
}

TEST(EngineImages, GreedyWithImagesMatchesTheSingleRunner) {
  const ImageFixture x = image_fixture();
  LLMEngine engine(fixture_model("kimi_k25"), test_config());
  const int T = 12;
  engine.add_request("a", x.prompt, greedy(T), x.images);
  std::vector<RequestOutput> done;
  while (engine.has_unfinished())
    for (RequestOutput& o : engine.step().finished) done.push_back(std::move(o));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].prompt_token_ids, x.expanded);  // the expanded prompt
  EXPECT_EQ(done[0].outputs[0].token_ids, single(x, x.images, T));
  // Without the images' features the same expanded ids continue otherwise.
  EXPECT_NE(done[0].outputs[0].token_ids,
            generate_greedy(fixture_model("kimi_k25"), x.expanded, T, {}, true).token_ids);
  expect_engine_idle(engine);
}

TEST(EngineImages, OtherImagesNeverShareCachedBlocksAndTheSameOnesDo) {
  const ImageFixture x = image_fixture();
  EngineConfig c = test_config();
  c.block_size = 4;
  LLMEngine engine(fixture_model("kimi_k25"), c);
  const std::vector<PromptImage> other = {random_image(x.images[0], 1),
                                          random_image(x.images[1], 2)};
  const int T = 6;
  auto run = [&](const std::string& id, const std::vector<PromptImage>& images) {
    engine.add_request(id, x.prompt, greedy(T), images);
    std::vector<RequestOutput> done;
    while (engine.has_unfinished())
      for (RequestOutput& o : engine.step().finished) done.push_back(std::move(o));
    EXPECT_EQ(done.size(), 1u);
    return done.at(0).outputs.at(0);
  };
  const CompletionOutput a = run("a", x.images);
  const CompletionOutput b = run("b", other);  // same tokens, other images
  const CompletionOutput c2 = run("c", x.images);
  EXPECT_EQ(a.token_ids, single(x, x.images, T));
  EXPECT_EQ(b.token_ids, single(x, other, T));
  EXPECT_NE(a.token_ids, b.token_ids) << "the images do not change the output: a weak test";
  EXPECT_EQ(c2.token_ids, a.token_ids);
  // b may reuse only the blocks before the first image; c reuses past both images.
  int first = 0;
  while (x.prompt[static_cast<size_t>(first)] != x.image_token) ++first;
  EXPECT_LE(b.num_cached_tokens, first / 4 * 4);
  EXPECT_GT(c2.num_cached_tokens, static_cast<int>(x.expanded.size()) - 8);
  expect_engine_idle(engine);
}

TEST(EngineImages, BatchedWithTextAndPreemptedRequestsMatchTheSingleRunner) {
  const ImageFixture x = image_fixture();
  EngineConfig c = test_config();
  c.max_model_len = 128;
  c.num_gpu_blocks_override = 12;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  LLMEngine engine(fixture_model("kimi_k25"), c);
  const int T = 24;
  std::vector<std::vector<PromptImage>> images;
  for (int i = 0; i < 5; ++i)
    images.push_back({random_image(x.images[0], 10 + i), random_image(x.images[1], 20 + i)});
  for (int i = 0; i < 5; ++i) {
    engine.add_request("img" + std::to_string(i), x.prompt, greedy(T), images[i]);
    engine.add_request("txt" + std::to_string(i), {5, 6, 7, int32_t(8 + i)}, greedy(T));
  }
  std::map<std::string, RequestOutput> done;
  while (engine.has_unfinished())
    for (RequestOutput& o : engine.step().finished) done[o.request_id] = std::move(o);
  int preemptions = 0;
  for (int i = 0; i < 5; ++i) {
    const CompletionOutput& o = done.at("img" + std::to_string(i)).outputs.at(0);
    EXPECT_EQ(o.token_ids, single(x, images[i], T)) << "request " << i;
    preemptions += o.num_preemptions;
    const std::vector<int32_t> text = {5, 6, 7, int32_t(8 + i)};
    EXPECT_EQ(done.at("txt" + std::to_string(i)).outputs.at(0).token_ids,
              generate_greedy(fixture_model("kimi_k25"), text, T, {}, true).token_ids);
  }
  EXPECT_GT(preemptions, 0) << "no request was preempted: the scenario does not test recompute";
  expect_engine_idle(engine);
}

// Images over ranks: tensor parallelism (each rank's embedding writes the features into its
// copy of the step) and pipeline stages (the first stage's embedding; a step's sequences cut into
// micro-batches, the runs of rows cut with them) give one rank's outputs.
TEST(EngineImages, TensorAndPipelineRanksMatchOneRank) {
  const ImageFixture x = image_fixture();
  std::vector<std::vector<PromptImage>> images = {x.images, x.images, x.images};
  for (int i = 1; i < 3; ++i) {
    Tensor p = x.images[i - 1].pixel_values.clone();
    for (int64_t j = 0; j < p.numel(); ++j) p.ptr<float>()[j] *= (i == 1 ? -1.0f : 0.5f);
    images[static_cast<size_t>(i)][static_cast<size_t>(i - 1)].pixel_values = p;
  }
  auto run = [&](LLMEngine& engine) {
    for (size_t i = 0; i < images.size(); ++i)
      engine.add_request("img" + std::to_string(i), x.prompt, greedy(8), images[i]);
    engine.add_request("txt", {5, 6, 7, 8, 9}, greedy(8));
    std::map<std::string, std::vector<int32_t>> out;
    while (engine.has_unfinished())
      for (RequestOutput& o : engine.step().finished) out[o.request_id] = o.outputs.at(0).token_ids;
    return out;
  };
  std::map<std::string, std::vector<int32_t>> want;
  {
    LLMEngine engine(fixture_model("kimi_k25"), test_config());
    want = run(engine);
  }
  EXPECT_NE(want["img0"], want["img1"]) << "the images do not change the output: a weak test";
  for (const auto& [tp, pp] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}, {2, 2}}) {
    ModelOptions o;
    o.pp_size = pp;
    auto group = model_group_load(fixture_dir("kimi_k25"), o, tp);
    // The tower on tensor rank 0 of the first and last stages only.
    for (int r = 0; r < group->world_size(); ++r)
      EXPECT_EQ(group->model(r).vision_encoder() != nullptr, r == 0 || r == group->leader())
          << "rank " << r;
    LLMEngine engine(*group, test_config());
    EXPECT_EQ(run(engine), want) << "tp " << tp << " pp " << pp;
  }
}

// Kimi-K3 (KDA layers with recurrent state, attention residuals, the latent MoE) with its
// MoonViT3d: prompts with images batched with each other and with prefix caching through state
// checkpoints give the single runner's tokens.
TEST(EngineImages, KimiK3WithImagesMatchesTheSingleRunner) {
  const std::vector<PromptImage> base = prompt_images_of(reference_images("kimi_k3_vision_torch"));
  Model& m = fixture_model("kimi_k3");
  VisionEncoder* v = m.vision_encoder();
  ASSERT_NE(v, nullptr);
  const int32_t img = static_cast<int32_t>(v->image_token_id());
  const std::vector<int32_t> prompt = {1, 11, 12, 13, 14, img, 21, 22, 23, img, 31, 32, 33};
  std::vector<std::vector<PromptImage>> images = {base, base, base};
  images[1][0] = random_image(base[0], 5);
  images[2][1] = random_image(base[1], 6);
  const int T = 10;
  auto single_k3 = [&](const std::vector<PromptImage>& ims) {
    std::vector<int32_t> p = prompt;
    auto mm = prompt_images_expand(*v, p, ims);
    std::shared_ptr<InputEmbeds> e;
    prompt_images_embeds(*mm, 0, static_cast<int>(p.size()), 0, e);
    return generate_greedy(m, p, T, {}, true, 16, std::nullopt, e.get()).token_ids;
  };
  EngineConfig c = test_config();
  c.block_size = 4;
  c.state_checkpoint_interval_tokens = 8;
  LLMEngine engine(m, c);
  std::map<std::string, std::vector<int32_t>> got;
  for (int pass = 0; pass < 2; ++pass) {  // the second pass resumes from the first's checkpoints
    for (size_t i = 0; i < images.size(); ++i)
      engine.add_request(std::to_string(pass) + "/" + std::to_string(i), prompt, greedy(T),
                         images[i]);
    while (engine.has_unfinished())
      for (RequestOutput& o : engine.step().finished) got[o.request_id] = o.outputs.at(0).token_ids;
  }
  for (size_t i = 0; i < images.size(); ++i) {
    const std::vector<int32_t> want = single_k3(images[i]);
    EXPECT_EQ(got["0/" + std::to_string(i)], want) << "request " << i;
    EXPECT_EQ(got["1/" + std::to_string(i)], want) << "request " << i << ", second pass";
  }
  EXPECT_NE(got["0/0"], got["0/1"]) << "the images do not change the output: a weak test";
  expect_engine_idle(engine);
}

TEST(EngineImages, BadRequestsAreRefusedByNameAndTheEngineGoesOn) {
  const ImageFixture x = image_fixture();
  EngineConfig c = test_config();
  LLMEngine engine(fixture_model("kimi_k25"), c);
  auto refused = [&](const std::vector<int32_t>& prompt, const std::vector<PromptImage>& images,
                     const std::string& what) {
    try {
      engine.add_request("bad", prompt, greedy(4), images);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(x.prompt, {x.images[0]}, "image placeholder tokens");
  std::vector<int32_t> no_placeholder = {5, 6, 7};
  refused(no_placeholder, x.images, "image placeholder tokens");
  PromptImage wrong = x.images[0];
  wrong.grid.w += 2;
  refused(x.prompt, {wrong, x.images[1]}, "do not fit its grid");
  PromptImage odd = x.images[1];
  odd.grid = {1, 3, 4};
  odd.pixel_values = Tensor::zeros({12, 3, 14, 14}, DType::kF32);
  refused(x.prompt, {x.images[0], odd}, "2x2 merge");
  {
    EngineConfig small = test_config();
    small.max_num_batched_tokens = 16;
    small.max_num_seqs = 16;
    LLMEngine e2(fixture_model("kimi_k25"), small);
    try {
      e2.add_request("long", x.prompt, greedy(4), x.images);
      ADD_FAILURE() << "a prompt with images longer than a step was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("max_num_batched_tokens"), std::string::npos)
          << e.what();
    }
  }
  {
    LLMEngine text_only(fixture_model("deepseek_v3"), c);
    try {
      text_only.add_request("img", {5, 6}, greedy(4), x.images);
      ADD_FAILURE() << "a text-only model took images";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("takes no images"), std::string::npos) << e.what();
    }
  }
  // Images expanded and encoded before add_request (as the server does off the engine thread)
  // must fit the prompt they come with.
  std::vector<int32_t> expanded = x.prompt;
  auto mm = prompt_images_expand(*fixture_model("kimi_k25").vision_encoder(), expanded, x.images);
  auto refused_mm = [&](std::vector<int32_t> prompt, const std::string& what) {
    try {
      engine.add_request("bad", std::move(prompt), greedy(4), mm);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused_mm(x.prompt, "do not fit");  // the unexpanded prompt
  std::vector<int32_t> shifted = expanded;
  shifted.insert(shifted.begin() + 1, 5);
  refused_mm(shifted, "not the image placeholder");
  std::vector<int32_t> extra = expanded;
  extra.push_back(static_cast<int32_t>(x.image_token));
  refused_mm(extra, "image placeholder tokens and its images fill");
  engine.add_request("pre", expanded, greedy(8), mm);
  std::vector<RequestOutput> pre;
  while (engine.has_unfinished())
    for (RequestOutput& o : engine.step().finished) pre.push_back(std::move(o));
  ASSERT_EQ(pre.size(), 1u);
  EXPECT_EQ(pre[0].outputs[0].token_ids, single(x, x.images, 8));
  // Nothing was queued; the engine serves the next request as before.
  EXPECT_FALSE(engine.has_unfinished());
  engine.add_request("good", x.prompt, greedy(8), x.images);
  std::vector<RequestOutput> done;
  while (engine.has_unfinished())
    for (RequestOutput& o : engine.step().finished) done.push_back(std::move(o));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].outputs[0].token_ids, single(x, x.images, 8));
  expect_engine_idle(engine);
}

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

// The tower behind a counter: how many images it was asked to encode.
struct CountingEncoder : VisionEncoder {
  VisionEncoder& inner;
  int calls = 0, images = 0;
  explicit CountingEncoder(VisionEncoder& v) : inner(v) {}
  Tensor encode(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) override {
    ++calls;
    images += static_cast<int>(grids.size());
    return inner.encode(pixel_values, grids);
  }
  Tensor encode_hidden(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) override {
    return inner.encode_hidden(pixel_values, grids);
  }
  int64_t tokens_for(const ImageGrid& g) const override { return inner.tokens_for(g); }
  int64_t image_token_id() const override { return inner.image_token_id(); }
  std::string unavailable() const override { return inner.unavailable(); }
};

// ImageFeatureCache: an image sent again skips the tower and gets the same features; only the
// new images of a prompt are encoded, in one call; a candidate with the same hash but other
// pixels is not a hit; the budget evicts the least recently used; 0 keeps nothing.
TEST(ImageFeatureCache, RepeatedImagesSkipTheTowerWithTheSameFeatures) {
  const ImageFixture x = image_fixture();
  Model& m = fixture_model("kimi_k25");
  CountingEncoder enc(*m.vision_encoder());
  ImageFeatureCache cache(int64_t{1} << 30);
  std::vector<int32_t> p1 = x.prompt;
  const auto a = prompt_images_expand(enc, p1, x.images, &cache);
  EXPECT_EQ(enc.calls, 1);
  EXPECT_EQ(enc.images, 2);
  EXPECT_EQ(cache.size(), 2u);
  std::vector<int32_t> p2 = x.prompt;
  const auto b = prompt_images_expand(enc, p2, x.images, &cache);
  EXPECT_EQ(enc.calls, 1) << "both images were cached";
  EXPECT_EQ(cache.hits(), 2);
  EXPECT_EQ(p2, p1);
  EXPECT_EQ(max_abs_diff(b->features, a->features), 0.0f);
  // Without a cache: the same features (each image alone or with the other: the tower
  // attends within an image only).
  std::vector<int32_t> p3 = x.prompt;
  const auto c = prompt_images_expand(*m.vision_encoder(), p3, x.images);
  EXPECT_LE(max_abs_diff(c->features, a->features), 1e-6f);
  // One new image beside a cached one: one call, one image.
  const PromptImage fresh = random_image(x.images[1], 77);
  std::vector<int32_t> p4 = x.prompt;
  const auto d = prompt_images_expand(enc, p4, {x.images[0], fresh}, &cache);
  EXPECT_EQ(enc.calls, 2);
  EXPECT_EQ(enc.images, 3);
  std::vector<int32_t> p5 = x.prompt;
  const auto e = prompt_images_expand(*m.vision_encoder(), p5, {x.images[0], fresh});
  EXPECT_LE(max_abs_diff(d->features, e->features), 1e-6f);
  EXPECT_GT(max_abs_diff(d->features, a->features), 1e-3f) << "the new image's rows";
  // Same hash and grid, other pixels: no hit (the hash only finds candidates).
  const uint64_t h = a->images[0].hash;
  EXPECT_FALSE(cache.find(h, random_image(x.images[0], 78)).defined());
  EXPECT_TRUE(cache.find(h, x.images[0]).defined());
  // A budget of one entry: the older one goes.
  const int64_t one = static_cast<int64_t>(x.images[0].pixel_values.nbytes() +
                                           a->features.narrow(0, 0, a->images[0].tokens).nbytes()) +
                      256;
  ImageFeatureCache small(one);
  small.insert(1, x.images[0], a->features.narrow(0, 0, a->images[0].tokens));
  EXPECT_EQ(small.size(), 1u);
  small.insert(2, fresh, a->features.narrow(0, 0, a->images[0].tokens));
  EXPECT_EQ(small.size(), 1u);
  EXPECT_FALSE(small.find(1, x.images[0]).defined());
  EXPECT_TRUE(small.find(2, fresh).defined());
  ImageFeatureCache none(0);
  none.insert(1, x.images[0], a->features);
  EXPECT_EQ(none.size(), 0u);
}

}  // namespace
}  // namespace atom::test
