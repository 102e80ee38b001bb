// Images in chat requests (issue 38 item 3, the server's part): data: URL decoding and its
// errors, the image content parts of /v1/chat/completions, /v1/messages and /v1/responses as the
// chat template sees them, the images handed to the backend (processed as atom_vision processes
// the same bytes), the per-prompt limit, and every refusal naming its part, over a fake backend
// that takes images; also a tool result's images (Messages tool_result image blocks), /tokenize's
// prompt with each image's placeholder expanded, and video parts refused by name.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <iterator>
#include <thread>

#include "common/fixtures.h"
#include "server/api_error.h"
#include "server/fake_backend.h"
#include "server/fake_server.h"
#include "server/http_server.h"
#include "server/protocol.h"
#include "vision/image.h"

namespace atom::test {
namespace {

using json = nlohmann::ordered_json;

std::vector<uint8_t> image_file(const std::string& name) {
  std::ifstream f(source_dir() + "/tests/fixtures/images/" + name, std::ios::binary);
  EXPECT_TRUE(f) << name;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string base64(const std::vector<uint8_t>& b) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < b.size(); i += 3) {
    const uint32_t v = (b[i] << 16) | (b[i + 1] << 8) | b[i + 2];
    for (int s = 18; s >= 0; s -= 6) out += k[(v >> s) & 63];
  }
  if (i + 1 == b.size()) {
    const uint32_t v = b[i] << 16;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == b.size()) {
    const uint32_t v = (b[i] << 16) | (b[i + 1] << 8);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += "=";
  }
  return out;
}

std::string data_url(const std::string& name, const std::string& type) {
  return "data:" + type + ";base64," + base64(image_file(name));
}

// The message of the ApiError `f` throws (a 400 naming `param`), or "" when it throws none.
template <typename F>
std::string refusal(F f, const std::string& param = "messages") {
  try {
    f();
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), param);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

#define EXPECT_CONTAINS(text, fragment) \
  EXPECT_NE(std::string(text).find(fragment), std::string::npos) << (text)

TEST(DataUrl, DecodesPngAndJpegBytesExactly) {
  for (const auto& [name, type] : {std::pair<std::string, std::string>{"photo.png", "image/png"},
                                   {"photo.jpg", "image/jpeg"},
                                   {"gray1.png", "IMAGE/PNG"},
                                   {"gray.jpg", "image/jpg"}}) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> bytes = image_file(name);
    EXPECT_EQ(server::image_data_url_decode(data_url(name, type), "p"), bytes);
    // MIME line breaks, the URL-safe alphabet, parameters before ;base64, and no padding.
    std::string b = base64(bytes), wrapped;
    for (size_t i = 0; i < b.size(); i += 76) wrapped += b.substr(i, 76) + "\r\n";
    EXPECT_EQ(server::image_data_url_decode("data:" + type + ";base64," + wrapped, "p"), bytes);
    std::string safe = b;
    for (char& c : safe) c = c == '+' ? '-' : c == '/' ? '_' : c;
    while (!safe.empty() && safe.back() == '=') safe.pop_back();
    EXPECT_EQ(server::image_data_url_decode("data:" + type + ";name=x.png;base64," + safe, "p"),
              bytes);
  }
}

TEST(DataUrl, RefusesEverythingElseByName) {
  auto msg = [](const std::string& url) {
    return refusal([&] { server::image_data_url_decode(url, "messages[2].content[1]"); });
  };
  const std::string png = base64(image_file("gray1.png"));
  for (const char* url : {"http://example.com/cat.png", "https://example.com/cat.png",
                          "HTTPS://EXAMPLE.COM/CAT.PNG"}) {
    const std::string m = msg(url);
    EXPECT_CONTAINS(m, "messages[2].content[1]: the server fetches no URLs; send the image as a "
                       "data: URL");
  }
  EXPECT_CONTAINS(msg("file:///etc/passwd"), "messages[2].content[1]: 'file' URLs are not "
                                             "supported; send the image as a data: URL");
  EXPECT_CONTAINS(msg("iVBORw0KGgo"), "must be a data: URL");
  EXPECT_CONTAINS(msg("data:image/png;base64"), "has no ','");
  EXPECT_CONTAINS(msg("data:image/gif;base64," + png),
                  "unsupported image media type 'image/gif' (PNG and JPEG are supported");
  EXPECT_CONTAINS(msg("data:;base64," + png), "unsupported image media type ''");
  EXPECT_CONTAINS(msg("data:image/png," + png), "must be base64-encoded");
  EXPECT_CONTAINS(msg("data:image/png;base64,iVBOR*0KGgo"),
                  "not valid base64 (character '*' at offset 5 of its data)");
  EXPECT_CONTAINS(msg("data:image/png;base64,iVBORw0KGgo=A"), "not valid base64");
  EXPECT_CONTAINS(msg("data:image/png;base64,iVBORw0KG"), "not a whole number of bytes");
  EXPECT_CONTAINS(msg("data:image/png;base64,"), "holds no image");
}

json user(json content) { return json::array({{{"role", "user"}, {"content", content}}}); }

TEST(ChatParse, TextPartsAreStillOneString) {
  const json parts =
      json::array({{{"type", "text"}, {"text", "one"}}, {{"type", "text"}, {"text", "two"}}});
  const server::ChatRequest r = server::chat_request_parse({{"messages", user(parts)}});
  EXPECT_EQ(r.messages[0]["content"], "one\ntwo");
  EXPECT_TRUE(r.images.empty());
  // A list without images keeps its old refusal of other parts.
  const std::string m = refusal([] {
    server::chat_request_parse({{"messages", user(json::array({{{"type", "input_audio"}}}))}});
  });
  EXPECT_CONTAINS(m, "messages[0].content[0].type 'input_audio' is not supported by this model");
}

TEST(ChatParse, ImagePartsStayPartsForTheTemplateInOrder) {
  const json parts =
      json::array({{{"type", "text"}, {"text", "compare"}},
                   {{"type", "image_url"}, {"image_url", {{"url", "data:a"}, {"detail", "low"}}}},
                   {{"type", "image_url"}, {"image_url", "data:b"}},
                   {{"type", "text"}, {"text", "and"}},
                   {{"type", "image"}, {"image", "data:c"}},
                   {{"type", "input_image"}, {"image_url", "data:d"}}});
  const json msgs = json::array(
      {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", parts}}});
  const server::ChatRequest r = server::chat_request_parse({{"messages", msgs}});
  EXPECT_EQ(r.messages[0]["content"], "be brief");
  EXPECT_EQ(r.messages[1]["content"], json::parse(R"([{"type":"text","text":"compare"},
      {"type":"image"},{"type":"image"},{"type":"text","text":"and"},{"type":"image"},
      {"type":"image"}])"));
  ASSERT_EQ(r.images.size(), 4u);
  const char* urls[] = {"data:a", "data:b", "data:c", "data:d"};
  const int idx[] = {1, 2, 4, 5};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.images[i].url, urls[i]);
    EXPECT_EQ(r.images[i].where, fmt::format("messages[1].content[{}]", idx[i]));
  }
}

TEST(ChatParse, ImageLimitAndMalformedPartsAreRefusedByName) {
  json parts = json::array();
  for (int i = 0; i < 3; ++i) parts.push_back({{"type", "image_url"}, {"image_url", "data:x"}});
  server::ProtocolLimits lim;
  lim.max_images = 2;
  EXPECT_CONTAINS(refusal([&] {
                    server::chat_request_parse({{"messages", user(parts)}}, lim);
                  }),
                  "messages[0].content[2]: at most 2 image(s) may be provided in one prompt");
  lim.max_images = 0;
  EXPECT_CONTAINS(refusal([&] {
                    server::chat_request_parse({{"messages", user(parts)}}, lim);
                  }),
                  "messages[0].content[0]: at most 0 image(s)");
  lim.max_images = 3;
  EXPECT_EQ(server::chat_request_parse({{"messages", user(parts)}}, lim).images.size(), 3u);
  auto bad = [](json part) {
    return refusal([&] {
      server::chat_request_parse(
          {{"messages",
            user(json::array({{{"type", "image_url"}, {"image_url", "data:x"}}, part}))}});
    });
  };
  EXPECT_CONTAINS(bad({{"type", "image_url"}}), "messages[0].content[1] (image_url part) needs");
  EXPECT_CONTAINS(bad({{"type", "image_url"}, {"image_url", 7}}),
                  "messages[0].content[1].image_url must be a data: URL string or an object");
  EXPECT_CONTAINS(bad({{"type", "input_audio"}}),
                  "messages[0].content[1].type 'input_audio' is not supported (text and image "
                  "parts are)");
  EXPECT_CONTAINS(bad({{"type", "text"}}), "messages[0].content[1] needs a string 'text'");
}

// Video parts (vLLM's video_url and video, input_video) are refused by name in any content: the
// server decodes no video containers.
TEST(ChatParse, VideoPartsAreRefusedByNameAsUnsupported) {
  for (const char* type : {"video_url", "video", "input_video"}) {
    SCOPED_TRACE(type);
    const json video = {{"type", type}, {type, {{"url", "data:video/mp4;base64,AAAA"}}}};
    // Beside text only, beside an image, and in a tool message.
    for (const json& parts :
         {json::array({{{"type", "text"}, {"text", "x"}}, video}),
          json::array({{{"type", "image_url"}, {"image_url", "data:x"}}, video})}) {
      EXPECT_CONTAINS(refusal([&] {
                        server::chat_request_parse({{"messages", user(parts)}});
                      }),
                      fmt::format("messages[0].content[1]: '{}' parts are not supported: videos "
                                  "are not supported by this server",
                                  type));
    }
    const json tool =
        json::array({{{"role", "tool"}, {"tool_call_id", "c"}, {"content", json::array({video})}}});
    EXPECT_CONTAINS(refusal([&] {
                      server::chat_request_parse({{"messages", tool}});
                    }),
                    "messages[0].content[0]: '" + std::string(type) + "' parts are not supported");
  }
}

// The server over a fake backend that takes images (or not).
class ChatImages : public FakeServerTest {
 protected:
  static constexpr int32_t kPad = 2;

  // The error message of a 400 (OpenAI's envelope or Anthropic's).
  static std::string error_of(const httplib::Result& r) {
    EXPECT_TRUE(r);
    if (!r) return "";
    EXPECT_EQ(r->status, 400) << r->body;
    const json j = json::parse(r->body);
    return j["error"]["message"].get<std::string>();
  }
  static json image_part(const std::string& url) {
    return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
  }
  static json chat(json content, int max_tokens = 4) {
    return {{"messages", user(std::move(content))}, {"max_tokens", max_tokens}};
  }
};

void expect_same_image(const vision::VisionInput& got, const std::string& file) {
  const vision::VisionInput want = vision::process_image_bytes(image_file(file));
  EXPECT_EQ(got.grid.t, want.grid.t);
  EXPECT_EQ(got.grid.h, want.grid.h);
  EXPECT_EQ(got.grid.w, want.grid.w);
  EXPECT_EQ(got.num_tokens, want.num_tokens);
  EXPECT_EQ(got.pixel_values, want.pixel_values);
}

TEST_F(ChatImages, ImagesReachTheBackendProcessedAndCounted) {
  backend.image_token_id = kPad;
  backend.reply = "ok";
  start();
  const json content = json::array({{{"type", "text"}, {"text", "what is this?"}},
                                    image_part(data_url("photo.png", "image/png")),
                                    image_part(data_url("photo.jpg", "image/jpeg"))});
  auto r = post("/v1/chat/completions", chat(content));
  ASSERT_EQ(r->status, 200) << r->body;
  const server::BackendRequest req = backend.last_request();
  ASSERT_EQ(req.images.size(), 2u);
  expect_same_image(req.images[0], "photo.png");
  expect_same_image(req.images[1], "photo.jpg");
  EXPECT_GT(req.images[0].num_tokens, 1);
  // The template saw the parts in order: one placeholder token per image, after the text.
  const std::vector<int32_t>& ids = req.prompt_ids;
  ASSERT_EQ(std::count(ids.begin(), ids.end(), kPad), 2);
  const auto first = std::find(ids.begin(), ids.end(), kPad);
  EXPECT_EQ(backend.detokenize(std::vector<int32_t>(ids.begin(), first), false),
            "<|user|>what is this?");
  // usage.prompt_tokens counts each image's tokens, not its placeholder.
  const json body = json::parse(r->body);
  const int64_t expanded =
      static_cast<int64_t>(ids.size()) + req.images[0].num_tokens + req.images[1].num_tokens - 2;
  EXPECT_EQ(body["usage"]["prompt_tokens"], expanded);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "ok");

  // A text-only request is as before: content parts joined, no images.
  r = post(
      "/v1/chat/completions",
      chat(json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}})));
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(backend.last_request().images.empty());
  EXPECT_EQ(backend.detokenize(backend.last_request().prompt_ids, false),
            "<|user|>a\nb<|assistant|>");
}

TEST_F(ChatImages, BadImagesAreRefusedByPartAndOthersAreServed) {
  backend.image_token_id = kPad;
  backend.reply = "fine";
  backend.delay = std::chrono::milliseconds(20);
  server::ServerOptions o;
  o.limits.max_images = 2;
  start(o);
  const std::string png = data_url("photo.png", "image/png");
  // A good request runs while the bad ones are refused.
  std::thread good([&] {
    httplib::Client c("127.0.0.1", srv->port());
    c.set_read_timeout(20, 0);
    auto r = c.Post("/v1/chat/completions", chat(json::array({image_part(png)}), 8).dump(),
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], "fine");
  });
  auto part_error = [&](const std::string& url) {
    return error_of(post("/v1/chat/completions",
                         chat(json::array({{{"type", "text"}, {"text", "x"}}, image_part(url)}))));
  };
  EXPECT_CONTAINS(part_error("https://example.com/a.png"),
                  "messages[0].content[1]: the server fetches no URLs; send the image as a data: "
                  "URL");
  EXPECT_CONTAINS(part_error("data:image/webp;base64,UklGRg=="),
                  "messages[0].content[1]: unsupported image media type 'image/webp'");
  EXPECT_CONTAINS(part_error("data:image/png;base64,not base64!"),
                  "messages[0].content[1]: the data: URL is not valid base64");
  // Malformed and truncated images: atom_vision's errors, named by the part.
  const std::vector<uint8_t> bytes = image_file("photo.png");
  EXPECT_CONTAINS(part_error("data:image/png;base64," +
                             base64(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 200))),
                  "messages[0].content[1]: ");
  EXPECT_CONTAINS(part_error("data:image/png;base64," + base64({'G', 'I', 'F', '8', '9', 'a'})),
                  "messages[0].content[1]: ");
  // Too many images for --limit-mm-per-prompt.
  EXPECT_CONTAINS(
      error_of(post("/v1/chat/completions",
                    chat(json::array({image_part(png), image_part(png), image_part(png)})))),
      "messages[0].content[2]: at most 2 image(s) may be provided in one prompt");
  // The placeholder written as text is no image.
  EXPECT_CONTAINS(
      error_of(post(
          "/v1/chat/completions",
          chat(json::array({{{"type", "text"}, {"text", "<|media_pad|>"}}, image_part(png)})))),
      "the prompt has 2 image placeholder token(s) (id 2) for 1 image(s)");
  good.join();
  EXPECT_EQ(srv->in_flight(), 0);
}

TEST_F(ChatImages, PromptLengthCountsTheImagesTokens) {
  backend.image_token_id = kPad;
  backend.max_model_len = 40;  // photo.png takes 35 tokens
  start();
  const json content = json::array({image_part(data_url("photo.png", "image/png"))});
  EXPECT_CONTAINS(error_of(post("/v1/chat/completions", chat(content, 8))),
                  "maximum context length is 40 tokens");
  backend.max_model_len = 256;
  backend.max_image_prompt_tokens = 30;
  EXPECT_CONTAINS(error_of(post("/v1/chat/completions", chat(content, 8))),
                  "exceed the server's --max-num-batched-tokens (30)");
}

TEST_F(ChatImages, TextOnlyModelsRefuseImagesClearly) {
  start();
  const std::string m = error_of(post(
      "/v1/chat/completions", chat(json::array({{{"type", "text"}, {"text", "x"}},
                                                image_part(data_url("photo.png", "image/png"))}))));
  EXPECT_CONTAINS(m, "messages[0].content[1]: this model (fake-model) takes no images");
}

// A vision tower that cannot run where the model is (the CUDA tower is not written yet) answers
// its reason as a 400 before anything reaches the engine.
TEST_F(ChatImages, ATowerThatCannotRunHereIsA400WithItsReason) {
  backend.images_unavailable = "MoonViT: images run on the CPU reference only for now";
  start();
  const std::string m = error_of(post(
      "/v1/chat/completions", chat(json::array({{{"type", "text"}, {"text", "x"}},
                                                image_part(data_url("photo.png", "image/png"))}))));
  EXPECT_CONTAINS(m, "messages[0].content[1]: MoonViT: images run on the CPU reference only");
}

TEST_F(ChatImages, MessagesApiImageBlocks) {
  backend.image_token_id = kPad;
  backend.reply = "a cup";
  start();
  const json block = {{"type", "image"},
                      {"source",
                       {{"type", "base64"},
                        {"media_type", "image/jpeg"},
                        {"data", base64(image_file("photo.jpg"))}}}};
  auto body = [](json content) {
    return json{{"model", "fake-model"},
                {"max_tokens", 8},
                {"messages", json::array({{{"role", "user"}, {"content", content}}})}};
  };
  auto r = post("/v1/messages", body(json::array({{{"type", "text"}, {"text", "what?"}}, block})));
  ASSERT_EQ(r->status, 200) << r->body;
  const server::BackendRequest req = backend.last_request();
  ASSERT_EQ(req.images.size(), 1u);
  expect_same_image(req.images[0], "photo.jpg");
  const json j = json::parse(r->body);
  EXPECT_EQ(j["content"][0]["text"], "a cup");
  EXPECT_EQ(j["usage"]["input_tokens"],
            static_cast<int64_t>(req.prompt_ids.size()) + req.images[0].num_tokens - 1);
  // count_tokens counts the image's tokens too.
  r = post("/v1/messages/count_tokens",
           body(json::array({{{"type", "text"}, {"text", "what?"}}, block})));
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["input_tokens"],
            static_cast<int64_t>(req.prompt_ids.size()) + req.images[0].num_tokens - 1);
  // A URL source, another media type and bad data are refused, named as the request names them.
  json url_block = {{"type", "image"},
                    {"source", {{"type", "url"}, {"url", "https://example.com/a.png"}}}};
  EXPECT_CONTAINS(error_of(post("/v1/messages",
                                body(json::array({{{"type", "text"}, {"text", "x"}}, url_block})))),
                  "messages[0].content[1]: the server fetches no URLs; send the image as a "
                  "base64 source");
  json gif = block;
  gif["source"]["media_type"] = "image/gif";
  EXPECT_CONTAINS(error_of(post("/v1/messages", body(json::array({gif})))),
                  "messages[0].content[0]: unsupported image media type 'image/gif'");
  json trunc = block;
  trunc["source"]["data"] = base64({0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10});
  EXPECT_CONTAINS(error_of(post("/v1/messages", body(json::array({trunc})))),
                  "messages[0].content[0]: ");
  json nosrc = {{"type", "image"}};
  EXPECT_CONTAINS(error_of(post("/v1/messages", body(json::array({nosrc})))),
                  "messages[0].content[0] needs a 'source' object");
}

// A tool_result's image blocks reach the model as a user turn's do: the tool message's content is
// its parts (text and image, in order) for the template, the image is decoded and handed to the
// backend, counted in usage and count_tokens and toward --limit-mm-per-prompt; a URL source or a
// bad image is a 400 naming the block.
TEST_F(ChatImages, MessagesApiToolResultImages) {
  backend.image_token_id = kPad;
  backend.reply = "a cup";
  server::ServerOptions o;
  o.limits.max_images = 2;
  start(o);
  auto image_block = [](const std::string& file, const std::string& type) {
    return json{
        {"type", "image"},
        {"source", {{"type", "base64"}, {"media_type", type}, {"data", base64(image_file(file))}}}};
  };
  // A tool call, then its result: text, an image, text.
  auto body = [](json result_content, json user_extra = json::array()) {
    json user_content = json::array({{{"type", "tool_result"},
                                      {"tool_use_id", "toolu_1"},
                                      {"content", std::move(result_content)}}});
    for (auto& b : user_extra) user_content.push_back(b);
    return json{
        {"model", "fake-model"},
        {"max_tokens", 8},
        {"messages", json::array({{{"role", "user"}, {"content", "take a screenshot"}},
                                  {{"role", "assistant"},
                                   {"content", json::array({{{"type", "tool_use"},
                                                             {"id", "toolu_1"},
                                                             {"name", "screenshot"},
                                                             {"input", json::object()}}})}},
                                  {{"role", "user"}, {"content", std::move(user_content)}}})}};
  };
  const json result = json::array({{{"type", "text"}, {"text", "here:"}},
                                   image_block("photo.jpg", "image/jpeg"),
                                   {{"type", "text"}, {"text", "done"}}});
  auto r = post("/v1/messages", body(result));
  ASSERT_EQ(r->status, 200) << r->body;
  const server::BackendRequest req = backend.last_request();
  ASSERT_EQ(req.images.size(), 1u);
  expect_same_image(req.images[0], "photo.jpg");
  // The template saw the tool message's parts in order, the image as its placeholder.
  const std::string prompt = backend.detokenize(req.prompt_ids, false);
  EXPECT_CONTAINS(prompt, "<|tool|>here:" + backend.detokenize(std::vector<int32_t>{kPad}, false) +
                              "done<|assistant|>");
  ASSERT_EQ(std::count(req.prompt_ids.begin(), req.prompt_ids.end(), kPad), 1);
  const int64_t expanded =
      static_cast<int64_t>(req.prompt_ids.size()) + req.images[0].num_tokens - 1;
  EXPECT_EQ(json::parse(r->body)["usage"]["input_tokens"], expanded);
  r = post("/v1/messages/count_tokens", body(result));
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["input_tokens"], expanded);
  // The same conversation through /v1/chat/completions (a tool message with an image part) gives
  // the backend the same prompt and image.
  const json chat_msgs =
      json::array({{{"role", "user"}, {"content", "take a screenshot"}},
                   {{"role", "assistant"},
                    {"content", nullptr},
                    {"tool_calls",
                     json::array({{{"id", "toolu_1"},
                                   {"type", "function"},
                                   {"function", {{"name", "screenshot"}, {"arguments", "{}"}}}}})}},
                   {{"role", "tool"},
                    {"tool_call_id", "toolu_1"},
                    {"content", json::array({{{"type", "text"}, {"text", "here:"}},
                                             image_part(data_url("photo.jpg", "image/jpeg")),
                                             {{"type", "text"}, {"text", "done"}}})}}});
  r = post("/v1/chat/completions", {{"messages", chat_msgs}, {"max_tokens", 8}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(backend.last_request().prompt_ids, req.prompt_ids);
  ASSERT_EQ(backend.last_request().images.size(), 1u);
  expect_same_image(backend.last_request().images[0], "photo.jpg");

  // Tool-result images and the user's count together toward --limit-mm-per-prompt (2).
  r = post("/v1/messages", body(json::array({image_block("gray1.png", "image/png"),
                                             image_block("gray1.png", "image/png")}),
                                json::array({image_block("photo.png", "image/png")})));
  EXPECT_CONTAINS(error_of(r), "messages[2].content[1]: at most 2 image(s) may be provided");
  r = post("/v1/messages", body(json::array({image_block("gray1.png", "image/png")}),
                                json::array({image_block("photo.png", "image/png")})));
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(backend.last_request().images.size(), 2u);
  // A URL source, a bad image and another block type, each named by its place in the result.
  const json url_block = {{"type", "image"},
                          {"source", {{"type", "url"}, {"url", "https://example.com/a.png"}}}};
  EXPECT_CONTAINS(error_of(post("/v1/messages",
                                body(json::array({{{"type", "text"}, {"text", "x"}}, url_block})))),
                  "messages[2].content[0].content[1]: the server fetches no URLs; send the image "
                  "as a base64 source");
  json trunc = image_block("photo.jpg", "image/jpeg");
  trunc["source"]["data"] = base64({0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10});
  EXPECT_CONTAINS(error_of(post("/v1/messages", body(json::array({trunc})))),
                  "messages[2].content[0].content[0]: ");
  EXPECT_CONTAINS(
      error_of(post("/v1/messages",
                    body(json::array({image_block("gray1.png", "image/png"),
                                      {{"type", "document"}, {"source", json::object()}}})))),
      "messages[2].content[0].content[1].type 'document' is not supported in a tool_result");
  // Text-only results are one string, as before.
  r = post(
      "/v1/messages",
      body(json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}})));
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(backend.last_request().images.empty());
  EXPECT_CONTAINS(backend.detokenize(backend.last_request().prompt_ids, false),
                  "<|tool|>a\nb<|assistant|>");
}

// /tokenize with messages returns the prompt as the engine runs it: each image's placeholder
// repeated its image's token count, counted; a bad image is the 400 chat gives.
TEST_F(ChatImages, TokenizeExpandsEachImagesPlaceholder) {
  backend.image_token_id = kPad;
  server::ServerOptions o;
  o.limits.max_images = 2;
  start(o);
  const json content = json::array({{{"type", "text"}, {"text", "what?"}},
                                    image_part(data_url("photo.png", "image/png")),
                                    image_part(data_url("gray1.png", "image/png"))});
  const vision::VisionInput photo = vision::process_image_bytes(image_file("photo.png"));
  const vision::VisionInput gray = vision::process_image_bytes(image_file("gray1.png"));
  ASSERT_EQ(photo.num_tokens, 35);
  ASSERT_EQ(gray.num_tokens, 4);
  auto r = post("/tokenize", {{"messages", user(content)}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  // The rendered prompt: "<|user|>what?" PAD PAD "<|assistant|>", each PAD expanded.
  std::vector<int32_t> want = backend.tokenize("<|user|>what?", false);
  want.insert(want.end(), 35, kPad);
  want.insert(want.end(), 4, kPad);
  for (int32_t t : backend.tokenize("<|assistant|>", false)) want.push_back(t);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(j["count"], want.size());
  // The count is what chat's usage.prompt_tokens reports for the same messages.
  r = post("/v1/chat/completions", chat(content));
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], j["count"]);
  // Text-only messages are as before.
  r = post("/tokenize", {{"messages", user("hi")}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["count"],
            backend.tokenize("<|user|>hi<|assistant|>", false).size());
  // Bad images: chat's 400s, named by the part.
  EXPECT_CONTAINS(
      error_of(post("/tokenize",
                    {{"messages", user(json::array({image_part("https://example.com/a.png")}))}})),
      "messages[0].content[0]: the server fetches no URLs");
  const std::vector<uint8_t> bytes = image_file("photo.png");
  EXPECT_CONTAINS(
      error_of(post("/tokenize",
                    {{"messages",
                      user(json::array({image_part(
                          "data:image/png;base64," +
                          base64(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 200)))}))}})),
      "messages[0].content[0]: ");
  EXPECT_CONTAINS(
      error_of(post(
          "/tokenize",
          {{"messages", user(json::array({image_part(data_url("gray1.png", "image/png")),
                                          image_part(data_url("gray1.png", "image/png")),
                                          image_part(data_url("gray1.png", "image/png"))}))}})),
      "messages[0].content[2]: at most 2 image(s)");
  EXPECT_CONTAINS(
      error_of(post(
          "/tokenize",
          {{"messages", user(json::array({{{"type", "text"}, {"text", "<|media_pad|>"}},
                                          image_part(data_url("gray1.png", "image/png"))}))}})),
      "the prompt has 2 image placeholder token(s) (id 2) for 1 image(s)");
  // A text-only model refuses them as chat does.
  backend.image_token_id = -1;
  EXPECT_CONTAINS(error_of(post("/tokenize", {{"messages", user(content)}})),
                  "messages[0].content[1]: this model (fake-model) takes no images");
}

// A video part is a 400 naming it through every API, while a request beside it is served.
TEST_F(ChatImages, VideoPartsAreRefusedThroughEveryApi) {
  backend.image_token_id = kPad;
  backend.reply = "fine";
  backend.delay = std::chrono::milliseconds(20);
  start();
  std::thread good([&] {
    httplib::Client c("127.0.0.1", srv->port());
    c.set_read_timeout(20, 0);
    auto r = c.Post("/v1/chat/completions",
                    chat(json::array({image_part(data_url("gray1.png", "image/png"))}), 8).dump(),
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], "fine");
  });
  const std::string unsupported =
      "parts are not supported: videos are not supported by this server";
  const json video_url = {{"type", "video_url"},
                          {"video_url", {{"url", "data:video/mp4;base64,AAAAIGZ0eXBpc29t"}}}};
  EXPECT_CONTAINS(
      error_of(post("/v1/chat/completions",
                    chat(json::array({{{"type", "text"}, {"text", "what happens?"}}, video_url})))),
      "messages[0].content[1]: 'video_url' " + unsupported);
  EXPECT_CONTAINS(
      error_of(
          post("/v1/chat/completions",
               chat(json::array({{{"type", "video"}, {"video", "data:video/mp4;base64,AA"}}})))),
      "messages[0].content[0]: 'video' " + unsupported);
  EXPECT_CONTAINS(error_of(post("/tokenize", {{"messages", user(json::array({video_url}))}})),
                  "messages[0].content[0]: 'video_url' " + unsupported);
  const json input_video = {{"type", "input_video"}, {"video_url", "data:video/mp4;base64,AA"}};
  for (const json& content :
       {json::array({{{"type", "input_text"}, {"text", "see"}}, input_video}),
        json::array({{{"type", "input_image"}, {"image_url", data_url("gray1.png", "image/png")}},
                     input_video})}) {
    auto r =
        post("/v1/responses", {{"input", json::array({{{"role", "user"}, {"content", content}}})}});
    EXPECT_CONTAINS(error_of(r), "input[0].content[1]: 'input_video' " + unsupported);
    EXPECT_EQ(json::parse(r->body)["error"]["param"], "input");
  }
  const json video_block = {
      {"type", "video"},
      {"source", {{"type", "base64"}, {"media_type", "video/mp4"}, {"data", "AAAA"}}}};
  auto msgs = [](json content) {
    return json{{"model", "fake-model"},
                {"max_tokens", 8},
                {"messages", json::array({{{"role", "user"}, {"content", content}}})}};
  };
  auto r =
      post("/v1/messages", msgs(json::array({{{"type", "text"}, {"text", "x"}}, video_block})));
  EXPECT_CONTAINS(error_of(r), "messages[0].content[1]: 'video' " + unsupported);
  EXPECT_EQ(json::parse(r->body)["type"], "error");
  EXPECT_CONTAINS(
      error_of(post("/v1/messages",
                    msgs(json::array({{{"type", "tool_result"},
                                       {"tool_use_id", "t"},
                                       {"content", json::array({{{"type", "text"}, {"text", "x"}},
                                                                video_block})}}})))),
      "messages[0].content[0].content[1]: 'video' " + unsupported);
  good.join();
  EXPECT_EQ(srv->in_flight(), 0);
  // Still serving.
  r = post("/v1/chat/completions", chat(json::array({{{"type", "text"}, {"text", "x"}}})));
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ChatImages, ResponsesApiInputImage) {
  backend.image_token_id = kPad;
  start();
  const json content =
      json::array({{{"type", "input_text"}, {"text", "see"}},
                   {{"type", "input_image"}, {"image_url", data_url("gray.jpg", "image/jpeg")}}});
  auto r =
      post("/v1/responses", {{"max_output_tokens", 4},
                             {"store", false},
                             {"input", json::array({{{"role", "user"}, {"content", content}}})}});
  ASSERT_EQ(r->status, 200) << r->body;
  ASSERT_EQ(backend.last_request().images.size(), 1u);
  expect_same_image(backend.last_request().images[0], "gray.jpg");
  const json file = json::array({{{"type", "input_image"}, {"file_id", "file-1"}}});
  r = post("/v1/responses", {{"input", json::array({{{"role", "user"}, {"content", file}}})}});
  EXPECT_CONTAINS(error_of(r), "input[0].content[0]: file_id images are not supported");
  const json remote =
      json::array({{{"type", "input_image"}, {"image_url", "http://example.com/a.jpg"}}});
  r = post("/v1/responses", {{"input", json::array({{{"role", "user"}, {"content", remote}}})}});
  EXPECT_CONTAINS(error_of(r), "input[0].content[0]: the server fetches no URLs");
}

}  // namespace
}  // namespace atom::test
