#include "engine/text_stream.h"

namespace atom {

std::string PieceTextStream::append(int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= pieces_->size()) return {};
  return (*pieces_)[static_cast<size_t>(id)];
}

TextStreamFactory piece_text_stream_factory(std::vector<std::string> pieces) {
  auto shared = std::make_shared<const std::vector<std::string>>(std::move(pieces));
  return [shared](std::span<const int32_t>, bool) -> std::unique_ptr<TokenTextStream> {
    return std::make_unique<PieceTextStream>(shared);
  };
}

std::optional<StopMatch> stop_string_find(const std::string& text, size_t new_from,
                                          const std::vector<std::string>& stops) {
  std::optional<StopMatch> best;
  for (size_t i = 0; i < stops.size(); ++i) {
    const std::string& s = stops[i];
    // A match that ends in the new text may start up to len(s) - 1 bytes before it.
    const size_t from = new_from >= s.size() ? new_from - s.size() + 1 : 0;
    const size_t pos = text.find(s, from);
    if (pos != std::string::npos && (!best || pos < best->pos)) best = StopMatch{pos, i};
  }
  return best;
}

}  // namespace atom
