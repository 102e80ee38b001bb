// The server's connection gate: request framing (Content-Length, chunked, limits) on its own, and
// the server against slow, many, malformed and oversized clients over real sockets.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "server/connection_gate.h"
#include "server/fake_backend.h"
#include "server/http_server.h"

namespace atom::test {
namespace {

using server::RequestFramer;
using State = RequestFramer::State;

// Feeds `req` in pieces of `step` bytes, as a socket delivers them.
RequestFramer frame(const std::string& req, size_t step = 1, size_t max_header = 1024,
                    size_t max_body = 100) {
  RequestFramer f(max_header, max_body);
  for (size_t n = std::min(step, req.size());; n = std::min(n + step, req.size())) {
    if (f.feed(std::string_view(req).substr(0, n)) != State::kNeedMore || n == req.size()) break;
  }
  return f;
}

TEST(RequestFramer, ContentLengthBodies) {
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
  for (size_t step : {1, 3, 1000}) {
    RequestFramer f = frame(req + "GET / HTTP/1.1\r\n", step);
    ASSERT_EQ(f.state(), State::kComplete) << step;
    EXPECT_EQ(f.request_bytes(), req.size());
    EXPECT_EQ(f.method(), "POST");
    EXPECT_EQ(f.target(), "/v1/completions");
  }
  EXPECT_EQ(frame("GET /health HTTP/1.1\r\n\r\n").state(), State::kComplete);
  EXPECT_EQ(frame("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhell").state(), State::kNeedMore);
}

TEST(RequestFramer, BadLengthsAreRefusedAtOnce) {
  auto status = [](const std::string& headers) {
    RequestFramer f = frame("POST / HTTP/1.1\r\n" + headers + "\r\n\r\n", 1000);
    EXPECT_EQ(f.state(), State::kError) << headers;
    return f.error_status();
  };
  EXPECT_EQ(status("Content-Length: -1"), 400);
  EXPECT_EQ(status("Content-Length: 1e3"), 400);
  EXPECT_EQ(status("Content-Length: "), 400);
  EXPECT_EQ(status("Content-Length: 0x10"), 400);
  EXPECT_EQ(status("Content-Length: 100000000000000000000"), 413);  // 10^20
  EXPECT_EQ(status("Content-Length: 18446744073709551617"), 413);   // 2^64 + 1: no wrap to 1
  EXPECT_EQ(status("Content-Length: 101"), 413);
  EXPECT_EQ(status("Content-Length: 5\r\nContent-Length: 6"), 400);
  EXPECT_EQ(status("Content-Length: 5\r\nTransfer-Encoding: chunked"), 400);
  EXPECT_EQ(status("Transfer-Encoding: gzip"), 501);
  EXPECT_EQ(status("X: a\nContent-Length: 5"), 400);  // bare LF
  EXPECT_EQ(status("X: a\r\n folded"), 400);
  EXPECT_EQ(status("No colon here"), 400);
  const RequestFramer f = frame("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 1000);
  EXPECT_NE(f.error_message().find("Content-Length"), std::string::npos) << f.error_message();
  EXPECT_EQ(frame("BAD\r\n\r\n", 1000).error_status(), 400);
  EXPECT_EQ(frame("GET / SPDY/3\r\n\r\n", 1000).error_status(), 400);
}

TEST(RequestFramer, HeadersOverTheLimitAre431EvenUnfinished) {
  const std::string never_ends = "GET / HTTP/1.1\r\nX: " + std::string(2000, 'a');
  RequestFramer f = frame(never_ends, 7);
  EXPECT_EQ(f.state(), State::kError);
  EXPECT_EQ(f.error_status(), 431);
}

TEST(RequestFramer, ChunkedBodiesAreHeldToTheBodyLimit) {
  const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string body = "5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nTrailer: t\r\n\r\n";
  for (size_t step : {1, 4, 1000}) {
    RequestFramer f = frame(head + body + "NEXT", step);
    ASSERT_EQ(f.state(), State::kComplete) << step;
    EXPECT_EQ(f.request_bytes(), head.size() + body.size());
  }
  // 100 bytes fit; 101 do not, whether in one chunk or many; a huge size line is refused before
  // any of its data arrives.
  std::string ok = head, over = head;
  for (int i = 0; i < 10; ++i) ok += "a\r\n0123456789\r\n";
  over = ok + "1\r\nx\r\n0\r\n\r\n";
  ok += "0\r\n\r\n";
  EXPECT_EQ(frame(ok, 5).state(), State::kComplete);
  RequestFramer f = frame(over, 5);
  EXPECT_EQ(f.state(), State::kError);
  EXPECT_EQ(f.error_status(), 413);
  EXPECT_EQ(frame(head + "ffffffff\r\n", 1000).error_status(), 413);
  EXPECT_EQ(frame(head + "ffffffffffffffffffff\r\n", 1000).error_status(), 413);
  EXPECT_EQ(frame(head + "zz\r\n", 1000).error_status(), 400);
  EXPECT_EQ(frame(head + "-1\r\n", 1000).error_status(), 400);
  EXPECT_EQ(frame(head + "2\r\nabcd", 1000).error_status(), 400);  // data longer than its size
  EXPECT_EQ(frame(head + std::string(2000, '1'), 1000).error_status(), 400);
}

// ---- the server ----

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may close early (a refused body)
    done += static_cast<size_t>(n);
  }
}

// Everything the server sends until it closes the connection (or 20 s pass).
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

class Gate : public ::testing::Test {
 protected:
  FakeBackend backend;
  server::Metrics metrics{"fake-model"};
  std::unique_ptr<server::HttpServer> srv;
  std::thread thread;

  void start(server::ServerOptions o = {}) {
    o.host = "127.0.0.1";
    o.port = 0;
    o.served_model_names = {"fake-model"};
    srv = std::make_unique<server::HttpServer>(backend, metrics, o);
    ASSERT_TRUE(srv->bind()) << srv->bind_error();
    thread = std::thread([this] { srv->serve(); });
  }
  void TearDown() override {
    if (srv) srv->stop();
    if (thread.joinable()) thread.join();
  }
  std::string exchange(const std::string& request) {
    const int fd = connect_to(srv->port());
    EXPECT_GE(fd, 0);
    send_all(fd, request);
    std::string reply = read_all(fd);
    close(fd);
    return reply;
  }
};

TEST_F(Gate, ManyTricklingClientsDoNotStarveHealthOrRequests) {
  server::ServerOptions o;
  o.threads = 4;  // far fewer handler threads than slow clients
  o.control_threads = 1;
  start(o);
  std::vector<int> slow;
  for (int i = 0; i < 300; ++i) {
    const int fd = connect_to(srv->port());
    ASSERT_GE(fd, 0);
    send_all(fd,
             i % 2
                 ? "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"
                 : "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro");
    slow.push_back(fd);
  }
  httplib::Client cli("127.0.0.1", srv->port());
  cli.set_read_timeout(20, 0);
  for (int round = 0; round < 3; ++round) {
    for (int fd : slow) send_all(fd, "x");  // still trickling
    auto h = cli.Get("/health");
    ASSERT_TRUE(h) << "health starved";
    EXPECT_EQ(h->status, 200);
    auto r =
        cli.Post("/v1/completions", R"({"prompt": "ok", "max_tokens": 2})", "application/json");
    ASSERT_TRUE(r) << "request starved";
    EXPECT_EQ(r->status, 200);
  }
  for (int fd : slow) close(fd);
}

TEST_F(Gate, BadContentLengthsAreAnsweredAtOnce) {
  start();
  for (const char* cl : {"-1", "100000000000000000000", "abc"}) {
    const std::string reply =
        exchange(std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ") + cl +
                 "\r\n\r\n");
    const bool is_400 = reply.rfind("HTTP/1.1 400", 0) == 0,
               is_413 = reply.rfind("HTTP/1.1 413", 0) == 0;
    EXPECT_TRUE(is_400 || is_413) << cl << ": " << reply;
    EXPECT_NE(reply.find("\"error\""), std::string::npos) << reply;
  }
}

TEST_F(Gate, ChunkedBodiesOverTheLimitAre413) {
  server::ServerOptions o;
  o.max_body_bytes = 64 << 10;
  start(o);
  const int fd = connect_to(srv->port());
  ASSERT_GE(fd, 0);
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  const std::string chunk = "4000\r\n" + std::string(0x4000, 'a') + "\r\n";
  for (int i = 0; i < 8; ++i) send_all(fd, chunk);  // 128 KiB: twice the limit
  const std::string reply = read_all(fd);
  close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply.substr(0, 200);
  // Within the limit, chunked is served.
  const std::string body = R"({"prompt": "ok", "max_tokens": 2})";
  char size[16];
  snprintf(size, sizeof size, "%zx", body.size());
  const std::string ok =
      exchange("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               "Transfer-Encoding: chunked\r\n\r\n" +
               std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
}

TEST_F(Gate, HeadersThatNeverEndTimeOutWith408) {
  server::ServerOptions o;
  o.http.header_timeout_s = 1;
  start(o);
  const std::string reply = exchange("GET /health HTTP/1.1\r\nHost: x\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.1 408", 0), 0u) << reply;
  EXPECT_NE(reply.find("--http-header-timeout"), std::string::npos) << reply;
}

TEST_F(Gate, KeepAliveAndPipelinedRequestsAreServedInOrder) {
  start();
  const std::string reply =
      exchange("GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
               "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\n{\"prompt\":\"ab\"}"
               "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  size_t a = reply.find("HTTP/1.1 200"), b = reply.find("HTTP/1.1 200", a + 1),
         c = reply.find("HTTP/1.1 200", b + 1);
  ASSERT_NE(c, std::string::npos) << reply;
  EXPECT_NE(reply.find("\"version\""), std::string::npos);
  EXPECT_NE(reply.find("\"tokens\""), std::string::npos);
  EXPECT_LT(reply.find("\"version\""), reply.find("\"tokens\""));
}

TEST_F(Gate, ExpectContinueGetsAnInterimAnswer) {
  start();
  const int fd = connect_to(srv->port());
  send_all(fd, "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: "
               "100-continue\r\nContent-Length: 15\r\n\r\n");
  char buf[64];
  const ssize_t n = recv(fd, buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 100 Continue", 0), 0u);
  send_all(fd, "{\"prompt\":\"ab\"}");
  const std::string reply = read_all(fd);
  close(fd);
  EXPECT_NE(reply.find("HTTP/1.1 200"), std::string::npos) << reply;
}

TEST_F(Gate, APortInUseIsAnError) {
  start();
  FakeBackend other_backend;
  server::Metrics other_metrics{"fake-model"};
  server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = srv->port();
  server::HttpServer second(other_backend, other_metrics, o);
  EXPECT_FALSE(second.bind());
  EXPECT_NE(second.bind_error().find("in use"), std::string::npos) << second.bind_error();
}

TEST_F(Gate, ConnectionsOverTheLimitGet503) {
  server::ServerOptions o;
  o.http.max_connections = 20;
  start(o);
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(connect_to(srv->port()));
  // The gate accepts in its own time: wait until the 21st is turned away.
  std::string reply;
  for (int i = 0; i < 100 && reply.rfind("HTTP/1.1 503", 0) != 0; ++i)
    reply = exchange("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.1 503", 0), 0u) << reply;
  for (int fd : idle) close(fd);
  for (int i = 0; i < 100 && reply.rfind("HTTP/1.1 200", 0) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    reply = exchange("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
  }
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
}

}  // namespace
}  // namespace atom::test
