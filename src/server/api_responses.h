// The OpenAI Responses API as vLLM serves it: POST /v1/responses (whole or streamed as its typed
// events), GET and DELETE /v1/responses/{id}, and previous_response_id over responses the server
// keeps (store, the default). Requests are served through the chat flow: the input items become
// chat messages, the answer's reasoning, text and calls become output items.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace atom::server {

class HttpServer;

// Stored responses: the response object and the whole conversation that led to it (chat
// messages, the instructions left out, as previous_response_id does not carry them over). Bounded
// by entries and bytes; the least recently used goes first.
class ResponseStore {
 public:
  ResponseStore(size_t max_entries, size_t max_bytes)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}
  struct Entry {
    nlohmann::ordered_json response;
    nlohmann::ordered_json messages;
  };
  void put(const std::string& id, Entry e);
  std::optional<Entry> get(const std::string& id);
  bool erase(const std::string& id);
  size_t size();

 private:
  struct Slot {
    std::string id;
    Entry entry;
    size_t bytes;
  };
  std::mutex mu_;
  std::list<Slot> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Slot>::iterator> by_id_;
  size_t bytes_ = 0;
  size_t max_entries_, max_bytes_;
};

void handle_responses(HttpServer& s, const httplib::Request& req, httplib::Response& res);
void handle_response_get(HttpServer& s, const std::string& id, httplib::Response& res);
void handle_response_delete(HttpServer& s, const std::string& id, httplib::Response& res);
void handle_response_cancel(HttpServer& s, const std::string& id, httplib::Response& res);

}  // namespace atom::server
