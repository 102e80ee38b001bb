// An HttpServer on a loopback port over a FakeBackend, for the gtest server tests: start() binds
// and serves it on a thread, post() sends a JSON body, TearDown stops it.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "server/fake_backend.h"
#include "server/http_server.h"

namespace atom::test {

class FakeServerTest : public ::testing::Test {
 protected:
  using json = nlohmann::ordered_json;

  FakeBackend backend;
  server::Metrics metrics{"fake-model"};
  std::unique_ptr<server::HttpServer> srv;
  std::thread thread;
  std::unique_ptr<httplib::Client> cli;

  void start(server::ServerOptions o = {}) {
    o.host = "127.0.0.1";
    o.port = 0;
    if (o.served_model_names.empty()) o.served_model_names = {"fake-model"};
    srv = std::make_unique<server::HttpServer>(backend, metrics, o);
    ASSERT_TRUE(srv->bind());
    thread = std::thread([this] { srv->serve(); });
    cli = std::make_unique<httplib::Client>("127.0.0.1", srv->port());
    cli->set_read_timeout(20, 0);
    for (int i = 0; i < 100; ++i) {
      if (auto r = cli->Get("/health"); r && r->status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "server did not start";
  }
  void TearDown() override {
    if (srv) srv->stop();
    if (thread.joinable()) thread.join();
  }
  httplib::Result post(const std::string& path, const json& body, const httplib::Headers& h = {}) {
    return cli->Post(path.c_str(), h, body.dump(), "application/json");
  }
};

}  // namespace atom::test
