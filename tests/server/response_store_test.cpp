// The Responses API's store: what previous_response_id reads, bounded by entries and bytes with
// the least recently used going first.
#include <gtest/gtest.h>

#include "server/api_responses.h"

namespace atom::server {
namespace {

ResponseStore::Entry entry(const std::string& text) {
  return {nlohmann::ordered_json{{"id", text}},
          nlohmann::ordered_json::array({{{"content", text}}})};
}

TEST(ResponseStore, KeepsAtMostMaxEntriesDroppingTheLeastRecentlyUsed) {
  ResponseStore s(2, 1 << 20);
  s.put("a", entry("a"));
  s.put("b", entry("b"));
  ASSERT_TRUE(s.get("a"));  // a is now the most recent
  s.put("c", entry("c"));   // b goes
  EXPECT_TRUE(s.get("a"));
  EXPECT_FALSE(s.get("b"));
  EXPECT_TRUE(s.get("c"));
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.get("c")->messages[0]["content"], "c");
}

TEST(ResponseStore, KeepsAtMostMaxBytes) {
  const size_t one = entry(std::string(100, 'x')).response.dump().size() +
                     entry(std::string(100, 'x')).messages.dump().size();
  ResponseStore s(100, 2 * one + one / 2);
  s.put("1", entry(std::string(100, 'x')));
  s.put("2", entry(std::string(100, 'y')));
  s.put("3", entry(std::string(100, 'z')));
  EXPECT_FALSE(s.get("1"));
  EXPECT_TRUE(s.get("2") && s.get("3"));
  // One larger than the whole bound is not kept, and evicts nothing.
  s.put("big", entry(std::string(10 * one, 'w')));
  EXPECT_FALSE(s.get("big"));
  EXPECT_EQ(s.size(), 2u);
}

TEST(ResponseStore, ReplacesAndErases) {
  ResponseStore s(4, 1 << 20);
  s.put("a", entry("first"));
  s.put("a", entry("second"));
  EXPECT_EQ(s.size(), 1u);
  EXPECT_EQ(s.get("a")->response["id"], "second");
  EXPECT_TRUE(s.erase("a"));
  EXPECT_FALSE(s.erase("a"));
  EXPECT_FALSE(s.get("a"));
  ResponseStore none(0, 1 << 20);
  none.put("a", entry("a"));
  EXPECT_FALSE(none.get("a"));
}

}  // namespace
}  // namespace atom::server
