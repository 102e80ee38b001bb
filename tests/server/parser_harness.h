// Feeds tool-call parsers an answer whole, split in two at every position, byte by byte and in
// random chunks (fixed seed), checks that every way gives the same content, reasoning and calls,
// and checks the streamed pieces: each call opens with one piece carrying its id and name, its
// argument pieces follow, and it is listed complete once, under the same id and name.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/tool_parser.h"

namespace atom::test {

struct Parsed {
  std::string content, reasoning;
  std::vector<std::pair<std::string, nlohmann::json>>
      calls;                               // name, arguments parsed (null if no JSON)
  std::vector<std::string> raw_arguments;  // the finished calls' arguments
  std::vector<std::string> streamed;       // each call's argument pieces joined
  std::vector<std::string> ids;
};

// What a call id must look like for `parser`.
inline bool id_ok(const std::string& parser, const std::string& id) {
  if (parser == "kimi_k2") return !id.empty();  // the model's own ("functions.f:0")
  if (parser == "mistral") {
    if (id.size() != 9) return false;
    for (char c : id)
      if (!std::isalnum(static_cast<unsigned char>(c))) return false;
    return true;
  }
  if (id.rfind("chatcmpl-tool-", 0) != 0 || id.size() != std::string("chatcmpl-tool-").size() + 32)
    return false;
  return id.find_first_not_of("0123456789abcdef", 14) == std::string::npos;
}

inline Parsed collect(const std::string& parser, const std::vector<server::ToolDelta>& ds) {
  Parsed p;
  std::vector<std::pair<std::string, std::string>> opened;  // id, name
  for (const auto& d : ds) {
    p.content += d.content;
    p.reasoning += d.reasoning;
    for (const auto& piece : d.deltas) {
      if (!piece.id.empty()) {
        EXPECT_EQ(piece.index, static_cast<int>(opened.size())) << "calls open in order";
        EXPECT_FALSE(piece.name.empty());
        EXPECT_TRUE(id_ok(parser, piece.id)) << piece.id;
        opened.emplace_back(piece.id, piece.name);
        p.streamed.emplace_back();
      } else {
        EXPECT_TRUE(piece.name.empty());
      }
      EXPECT_GE(piece.index, 0);
      EXPECT_LT(piece.index, static_cast<int>(opened.size())) << "arguments before the call's name";
      if (piece.index >= 0 && piece.index < static_cast<int>(p.streamed.size()))
        p.streamed[piece.index] += piece.arguments;
    }
    for (const auto& c : d.calls) {
      const size_t i = p.calls.size();
      EXPECT_LT(i, opened.size()) << "a call finished without being opened";
      if (i < opened.size()) {
        EXPECT_EQ(c.id, opened[i].first);
        EXPECT_EQ(c.name, opened[i].second);
      }
      const auto args = nlohmann::json::parse(c.arguments, nullptr, false);
      p.calls.emplace_back(c.name, args.is_discarded() ? nlohmann::json() : args);
      p.raw_arguments.push_back(c.arguments);
      p.ids.push_back(c.id);
    }
  }
  EXPECT_EQ(p.calls.size(), opened.size()) << "every opened call is finished by finish()";
  return p;
}

inline Parsed parse_whole(const std::string& parser, const std::string& text,
                          const server::ToolParserOptions& o = {}) {
  return collect(parser, {server::make_tool_parser(parser, o)->parse(text)});
}

inline Parsed parse_pieces(const std::string& parser, const std::vector<std::string>& pieces,
                           const server::ToolParserOptions& o = {}) {
  auto p = server::make_tool_parser(parser, o);
  std::vector<server::ToolDelta> ds;
  for (const auto& s : pieces) ds.push_back(p->feed(s));
  ds.push_back(p->finish());
  return collect(parser, ds);
}

inline void expect_same(const Parsed& a, const Parsed& w, const std::string& how, bool ids) {
  EXPECT_EQ(a.content, w.content) << how;
  EXPECT_EQ(a.reasoning, w.reasoning) << how;
  EXPECT_EQ(a.calls, w.calls) << how;
  EXPECT_EQ(a.raw_arguments, w.raw_arguments) << how;
  EXPECT_EQ(a.streamed, w.streamed) << how;
  if (ids) {
    EXPECT_EQ(a.ids, w.ids) << how;
  }
}

// The whole-text result, checked equal to every two-way split, a byte-by-byte feed and random
// chunkings. `stream_is_final`: the streamed argument pieces join into the finished arguments
// (true for every format but harmony, whose finished arguments are re-serialised).
inline Parsed parse_every_way(const std::string& parser, const std::string& text,
                              const server::ToolParserOptions& o = {},
                              bool stream_is_final = true) {
  const Parsed w = parse_whole(parser, text, o);
  const bool ids = parser == "kimi_k2";  // the only format whose ids come from the text
  for (size_t i = 0; i <= text.size(); ++i)
    expect_same(parse_pieces(parser, {text.substr(0, i), text.substr(i)}, o), w,
                "split at " + std::to_string(i), ids);
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  expect_same(parse_pieces(parser, bytes, o), w, "byte by byte", ids);
  std::mt19937 rng(1234);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(0, 9)(rng);
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    expect_same(parse_pieces(parser, pieces, o), w, "random round " + std::to_string(round), ids);
  }
  if (stream_is_final) {
    EXPECT_EQ(w.streamed, w.raw_arguments);
  }
  return w;
}

// A tools list for ToolParserOptions from JSON text (key order kept, as requests keep it).
inline server::ToolParserOptions with_tools(const std::string& tools_json) {
  server::ToolParserOptions o;
  o.tools = nlohmann::ordered_json::parse(tools_json);
  return o;
}

}  // namespace atom::test
