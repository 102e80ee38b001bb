// Stop-string search on growing text: a match is found whichever pieces it spans, exactly once,
// at its first position.
#include "engine/text_stream.h"

#include <gtest/gtest.h>

namespace atom {
namespace {

// Feeds pieces one by one as the engine does; returns (piece index, position) of the first match.
std::pair<int, size_t> first_stop(const std::vector<std::string>& pieces,
                                  const std::vector<std::string>& stops) {
  std::string text;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const size_t before = text.size();
    text += pieces[i];
    if (auto m = stop_string_find(text, before, stops)) return {static_cast<int>(i), m->pos};
  }
  return {-1, 0};
}

TEST(StopStrings, FoundAcrossPieceBoundaries) {
  EXPECT_EQ(first_stop({"Hel", "lo wo", "rld"}, {"o w"}), std::make_pair(1, size_t{4}));
  EXPECT_EQ(first_stop({"ab", "c", "d", "ef"}, {"bcde"}), std::make_pair(3, size_t{1}));
  EXPECT_EQ(first_stop({"a", "b", "c"}, {"abc"}), std::make_pair(2, size_t{0}));
  EXPECT_EQ(first_stop({"xx", "STOP"}, {"STOP"}), std::make_pair(1, size_t{2}));
  EXPECT_EQ(first_stop({"nothing", " here"}, {"STOP"}), std::make_pair(-1, size_t{0}));
}

TEST(StopStrings, EarliestOfSeveral) {
  EXPECT_EQ(first_stop({"one two three"}, {"three", "two"}), std::make_pair(0, size_t{4}));
  // A match completed later but starting earlier wins over nothing; text already searched is not
  // searched again.
  EXPECT_EQ(first_stop({"aXb", "Yc"}, {"bY", "XbYc"}), std::make_pair(1, size_t{1}));
}

TEST(PieceTextStream, MapsIdsToPieces) {
  auto make = piece_text_stream_factory({"a", "bc", ""});
  auto s = make({}, true);
  EXPECT_EQ(s->append(1), "bc");
  EXPECT_EQ(s->append(0), "a");
  EXPECT_EQ(s->append(7), "");
  EXPECT_EQ(s->finish(), "");
}

}  // namespace
}  // namespace atom
