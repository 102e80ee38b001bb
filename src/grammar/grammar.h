// Context-free grammars for structured output, in llama.cpp's GBNF notation, compiled to a form a
// pushdown matcher walks one code point at a time.
//
//   root   ::= object
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   name   ::= [a-zA-Z_] [a-zA-Z0-9_]{0,31}
//
// Terminals are "strings", character classes [a-z\n] and [^"\\], and `.` (any character);
// grouping ( ), alternation |, repetition * + ? {m} {m,} {m,n}; `#` starts a comment. Repetition
// and groups become generated right-recursive rules, so the compiled grammar is only sequences of
// character sets and rule references. A left-recursive rule (one that can reach itself without
// consuming a character) or a reference to an undefined rule is an error naming it.
//
// Grammars come from requests, so every size is bounded (GrammarLimits) and an error says which
// bound was hit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atom::grammar {

struct GrammarLimits {
  size_t max_text_bytes = 1 << 20;  // grammar, schema or regex source
  size_t max_items = 1 << 20;       // compiled character sets and references
  int max_nesting = 200;            // ( ) groups, schema and regex nesting
  int max_repeat = 10000;           // m and n of {m,n}
  size_t max_stacks = 4096;         // live parse stacks of a matcher (ambiguity)
};

struct CharRange {
  char32_t lo, hi;  // inclusive
};

// One element of an alternative: a character set (ranges, possibly negated), a reference to a
// rule, or the end of the alternative.
struct Item {
  enum Kind : uint8_t { kEnd, kChars, kRule };
  Kind kind = kEnd;
  bool negated = false;
  uint32_t rule = 0;                          // kRule
  uint32_t ranges_begin = 0, ranges_end = 0;  // kChars: into Grammar::ranges
};

class Grammar {
 public:
  // Parses GBNF; `root` names the start rule. Throws atom::Error naming the line and column, an
  // undefined or left-recursive rule, or the limit exceeded.
  static Grammar from_gbnf(std::string_view text, const GrammarLimits& limits = {},
                           std::string_view root = "root");

  bool char_matches(const Item& it, char32_t c) const;
  // Whether some code point in [lo, hi] matches (for a UTF-8 character still being read).
  bool char_range_matches(const Item& it, char32_t lo, char32_t hi) const;

  std::vector<Item> items;
  std::vector<CharRange> ranges;
  std::vector<std::vector<uint32_t>>
      rule_alts;  // per rule: the item index each alternative starts at
  std::vector<std::string> rule_names;
  uint32_t root = 0;
  GrammarLimits limits;
};

// GBNF for JSON text matching a JSON Schema (draft 2020-12 subset: type, enum, const, properties
// with required, additionalProperties, items, prefixItems, minItems/maxItems, anyOf/oneOf, allOf of
// one, $ref into $defs/definitions, string minLength/maxLength/pattern/format (date, time,
// date-time, uuid, email, ipv4), integer and number). Keywords that cannot be expressed in a
// grammar (minimum, maximum, multipleOf, uniqueItems) are not enforced. Properties are written
// in schema order; whitespace is at most one space after ',' and ':'. Throws naming the keyword it
// cannot handle.
std::string json_schema_to_gbnf(const std::string& schema_json, const GrammarLimits& limits = {});
// GBNF for vLLM's structural tag ({"structures": [{"begin", "schema", "end"}], "triggers": [...]}):
// free text that holds no trigger, where a trigger that appears must go on as one of the
// structures whose begin starts with it (the rest of begin, JSON matching its schema, its end),
// then free text again. Throws naming the field at fault.
std::string structural_tag_to_gbnf(const std::string& spec_json, const GrammarLimits& limits = {});
// GBNF for any JSON object (response_format json_object).
std::string json_object_gbnf();
// GBNF for text matching an (ECMAScript-style) regular expression, anchored at both ends:
// literals and escapes, classes [..] [^..] \d \w \s \D \W \S, `.`, groups (?: ), alternation,
// * + ? {m} {m,} {m,n} (lazy forms accepted as the greedy ones). Backreferences and lookaround
// are refused by name.
std::string regex_to_gbnf(std::string_view pattern, const GrammarLimits& limits = {});
// GBNF for exactly one of the strings.
std::string choice_to_gbnf(const std::vector<std::string>& choices);
// A GBNF string literal for `s` ("..." with escapes).
std::string gbnf_literal(std::string_view s);

}  // namespace atom::grammar
