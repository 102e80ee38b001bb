// The engine's text streams backed by a real tokenizer: each sequence gets an incremental
// detokenizer (never emits a broken UTF-8 sequence; the streamed pieces add up to decode()).
#pragma once

#include "engine/text_stream.h"
#include "tokenizer/tokenizer.h"

namespace atom {

TextStreamFactory tokenizer_text_streams(tokenizer::Tokenizer tok);

}  // namespace atom
