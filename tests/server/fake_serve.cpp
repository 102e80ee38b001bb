// atom's HTTP server over the fake backend (fake_backend.h), for client tests that need a model
// to say given things: the openai npm client test drives a gpt-oss-style tool call through it.
//
//   atom_fake_serve REPLIES.json [--harmony] [--tool-call-parser NAME] [--reasoning-parser NAME]
//                   [--enable-auto-tool-choice]
//
// REPLIES.json is {"default": TEXT, "replies": [[KEY, TEXT], ...]}: a request whose prompt
// contains KEY gets that TEXT, others the default. Serves on a free port of 127.0.0.1 and logs
// "serving fake-model at http://127.0.0.1:PORT" as `atom serve` does.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "server/fake_backend.h"
#include "server/http_server.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: atom_fake_serve REPLIES.json [--harmony] [--tool-call-parser NAME] "
                 "[--reasoning-parser NAME] [--enable-auto-tool-choice]\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  const auto replies = nlohmann::json::parse(text.str(), nullptr, false);
  if (!in || replies.is_discarded() || !replies.is_object()) {
    std::cerr << argv[1] << ": not a JSON object\n";
    return 2;
  }
  atom::test::FakeBackend backend;
  backend.max_model_len = 4096;
  backend.reply = replies.value("default", "");
  for (const auto& r : replies.value("replies", nlohmann::json::array()))
    backend.replies.emplace_back(r.at(0).get<std::string>(), r.at(1).get<std::string>());
  atom::server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.served_model_names = {"fake-model"};
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--harmony") {
      backend.harmony = true;
    } else if (a == "--enable-auto-tool-choice") {
      o.enable_auto_tool_choice = true;
    } else if (a == "--tool-call-parser" && i + 1 < argc) {
      o.tool_call_parser = argv[++i];
    } else if (a == "--reasoning-parser" && i + 1 < argc) {
      o.reasoning_parser = argv[++i];
    } else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  atom::server::Metrics metrics("fake-model");
  atom::server::HttpServer http(backend, metrics, o);
  if (!http.bind()) return 1;
  std::fprintf(stderr, "serving fake-model at http://127.0.0.1:%d\n", http.port());
  std::fflush(stderr);
  http.serve();
  return 0;
}
