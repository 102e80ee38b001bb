// libFuzzer harness: bytes from a client, through the gate's request framing, cpp-httplib's
// parser and every route's request validation (a fake backend that refuses to generate, so each
// generation request is parsed, templated and tokenized, then answered 503).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "server/fake_backend.h"
#include "server/http_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* backend = [] {
    auto* b = new atom::test::FakeBackend();
    b->max_waiting = 0;  // submit() refuses: nothing is generated
    return b;
  }();
  static auto* metrics = new atom::server::Metrics("fake-model");
  static auto* server = [] {
    atom::server::ServerOptions o;
    o.served_model_names = {"fake-model"};
    o.max_body_bytes = 1 << 20;
    o.api_key = "k";
    return new atom::server::HttpServer(*backend, *metrics, o);
  }();
  server->serve_bytes(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
