#include "tokenizer/post_processor.h"

#include <map>

namespace atom::tokenizer {

namespace {

class TemplatePost final : public PostProcessor {
 public:
  TemplatePost(const Json& j, const std::string& where) {
    std::map<std::string, std::vector<int32_t>> specials;
    if (auto it = j.find("special_tokens"); it != j.end() && !it->is_null()) {
      if (!it->is_object()) fail("{}.special_tokens: expected an object", where);
      for (const auto& [name, tok] : it->items()) {
        const std::string w = fmt::format("{}.special_tokens[\"{}\"]", where, name);
        const Json& ids = json_field(tok, "ids", w);
        if (!ids.is_array()) fail("{}.ids: expected an array", w);
        std::vector<int32_t> v;
        for (const Json& id : ids) {
          if (!id.is_number_integer()) fail("{}.ids: expected integers", w);
          v.push_back(id.get<int32_t>());
        }
        specials[name] = std::move(v);
      }
    }
    const Json& single = json_field(j, "single", where);
    if (!single.is_array()) fail("{}.single: expected an array", where);
    for (size_t i = 0; i < single.size(); ++i) {
      const Json& p = single[i];
      const std::string w = fmt::format("{}.single[{}]", where, i);
      std::string special;
      bool is_sequence = false;
      if (p.is_string()) {
        // Short form: "$A", "$B", "$0", "$A:1", "[CLS]", "[CLS]:0".
        std::string s = p.get<std::string>();
        if (auto colon = s.find(':'); colon != std::string::npos) s.resize(colon);
        if (!s.empty() && s[0] == '$') {
          is_sequence = true;
          if (s == "$B" || s == "$1") continue;  // the pair sequence: not part of a single encode
        } else {
          special = s;
        }
      } else if (p.is_object() && p.contains("Sequence")) {
        is_sequence = true;
        if (json_string(p["Sequence"], "id", w + ".Sequence") == "B") continue;
      } else if (p.is_object() && p.contains("SpecialToken")) {
        special = json_string(p["SpecialToken"], "id", w + ".SpecialToken");
      } else {
        fail("{}: expected {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", w);
      }
      if (is_sequence) {
        pieces_.push_back({});
      } else {
        auto it = specials.find(special);
        if (it == specials.end())
          fail("{}: special token \"{}\" is missing from special_tokens", w, special);
        pieces_.push_back(it->second);
      }
    }
  }
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int32_t> out;
    out.reserve(ids.size() + 8);
    for (const auto& p : pieces_) {
      if (p.empty()) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), p.begin(), p.end());
      }
    }
    ids.swap(out);
  }

 private:
  // An empty entry stands for the sequence itself; a special token always has ids.
  std::vector<std::vector<int32_t>> pieces_;
};

// BertProcessing ([CLS] A [SEP]) and RobertaProcessing (<s> A </s>).
class WrapPost final : public PostProcessor {
 public:
  WrapPost(const Json& j, const std::string& where) {
    auto read = [&](const char* key) {
      const Json& v = json_field(j, key, where);
      if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer()) {
        fail("{}.{}: expected [token, id]", where, key);
      }
      return v[1].get<int32_t>();
    };
    cls_ = read("cls");
    sep_ = read("sep");
  }
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), cls_);
    ids.push_back(sep_);
  }

 private:
  int32_t cls_, sep_;
};

class NoOpPost final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&, bool) const override {}
};

class SequencePost final : public PostProcessor {
 public:
  explicit SequencePost(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& p : parts_) p->process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

}  // namespace

std::unique_ptr<PostProcessor> post_processor_from_json(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_type(j, where);
  if (type == "TemplateProcessing") return std::make_unique<TemplatePost>(j, where);
  if (type == "ByteLevel") return std::make_unique<NoOpPost>();
  if (type == "BertProcessing" || type == "RobertaProcessing")
    return std::make_unique<WrapPost>(j, where);
  if (type == "Sequence") {
    const Json& list = json_field(j, "processors", where);
    if (!list.is_array()) fail("{}.processors: expected an array", where);
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = post_processor_from_json(list[i], fmt::format("{}.processors[{}]", where, i));
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePost>(std::move(parts));
  }
  fail("{}: post-processor type \"{}\" is not supported by atom (supported: TemplateProcessing, "
       "ByteLevel, BertProcessing, RobertaProcessing, Sequence)",
       where, type);
}

}  // namespace atom::tokenizer
