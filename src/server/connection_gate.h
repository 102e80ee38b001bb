// The server's front door: one event-driven thread (epoll) accepts connections and reads each
// request whole (headers and body) under size limits and deadlines before any handler thread sees
// it. A slow, idle or trickling client costs a socket and its bytes so far, never a thread, so
// thousands of them do not starve /health or real requests; framing errors (a bad or oversized
// Content-Length, a chunked body over the limit, headers that never end) are answered at once.
// Complete requests go to a dispatcher (the HTTP server's handler threads), which hands the
// connection back for its next request.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

namespace atom::server {

// Bounds on what a client may send and how long it may take (serving.md, "Limits").
struct GateLimits {
  size_t max_header_bytes = 64u << 10;  // request line and headers
  size_t max_body_bytes = 32u << 20;    // decoded body (Content-Length or chunked)
  // All unfinished requests' bytes together; a request that would pass it gets 503.
  size_t max_buffered_bytes = size_t{1} << 30;
  int header_timeout_s = 10;      // from a request's first byte to the end of its headers
  int body_timeout_s = 60;        // from the end of the headers to the end of the body
  int keep_alive_timeout_s = 30;  // an open connection with no request started
  int max_connections = 16384;    // more get 503 (also bounded by the process's file limit)
};

// Frames one HTTP/1.1 request: finds the end of its headers and of its body (Content-Length or
// chunked) without interpreting anything else, and refuses framing it cannot trust. Fed the
// request's bytes so far each time more arrive (the same prefix, growing); resumes where it left.
class RequestFramer {
 public:
  enum class State { kNeedMore, kComplete, kError };
  RequestFramer(size_t max_header_bytes, size_t max_body_bytes)
      : max_header_(max_header_bytes), max_body_(max_body_bytes) {}

  State feed(std::string_view bytes);
  State state() const { return state_; }
  bool headers_done() const { return header_end_ > 0; }
  // Bytes of the whole request (headers and body) once kComplete.
  size_t request_bytes() const { return end_; }
  // kError: the status to answer (400, 413, 431, 501) and why.
  int error_status() const { return status_; }
  const std::string& error_message() const { return message_; }
  const std::string& method() const { return method_; }
  const std::string& target() const { return target_; }
  bool expects_continue() const { return expect_continue_; }

 private:
  State fail(int status, std::string message);
  State parse_headers(std::string_view head);
  State feed_chunked(std::string_view bytes);

  size_t max_header_, max_body_;
  State state_ = State::kNeedMore;
  size_t scanned_ = 0;     // header search resumes here
  size_t header_end_ = 0;  // offset of the body
  size_t end_ = 0;
  bool chunked_ = false;
  uint64_t content_length_ = 0;
  bool expect_continue_ = false;
  std::string method_, target_;
  int status_ = 0;
  std::string message_;
  // Chunked decoding.
  enum class Chunk { kSize, kData, kDataEnd, kTrailer } chunk_ = Chunk::kSize;
  size_t pos_ = 0;          // next byte to decode
  uint64_t remaining_ = 0;  // of the current chunk's data
  uint64_t decoded_ = 0;    // body bytes so far
};

// A client connection. Owned by the gate while a request is being read, by one handler thread
// while it is served.
struct Connection {
  int fd = -1;
  std::string remote_ip;
  int remote_port = 0;
  std::string buf;           // received, not yet consumed
  size_t request_bytes = 0;  // while dispatched: the complete request at the front of buf
  std::string method, target;

  enum class Phase { kIdle, kHeaders, kBody, kClosing } phase = Phase::kIdle;
  std::chrono::steady_clock::time_point deadline;
  std::unique_ptr<RequestFramer> framer;
  bool sent_continue = false;
};

class ConnectionGate {
 public:
  using Dispatch = std::function<void(std::shared_ptr<Connection>)>;
  ConnectionGate(GateLimits limits, Dispatch dispatch);
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // Listens on host:port (port 0: a free port). Empty on success, else why not (a port in use is
  // an error: the socket does not share ports, no SO_REUSEPORT).
  std::string listen(const std::string& host, int port);
  int port() const { return port_; }
  // The event loop, until stop().
  void run();
  // Stops accepting, closes connections waiting for a request, ends run(). Thread-safe.
  void stop();
  // Graceful shutdown, first half (thread-safe): stops listening (new connections are refused),
  // closes idle connections, keeps reading requests already begun, and closes each connection
  // once its response is written. run() goes on until stop().
  void begin_drain();
  bool draining() const { return draining_.load(); }
  // Draining, and no request is being read or served: what stop() would cut short is nothing.
  bool drained() const {
    return drain_started_.load() && partial_.load() == 0 && dispatched_.load() == 0;
  }
  // A dispatched connection's request has been answered: its next request is read here.
  void resume(std::shared_ptr<Connection> c);
  // A dispatched connection is done with.
  void close(std::shared_ptr<Connection> c);
  // Connections open (gate and handlers).
  int connections() const { return open_.load(); }
  const GateLimits& limits() const { return limits_; }

 private:
  void accept_all();
  void on_readable(const std::shared_ptr<Connection>& c);
  void advance(const std::shared_ptr<Connection>& c);  // frame what is buffered; dispatch or wait
  void reject(const std::shared_ptr<Connection>& c, int status, const std::string& message);
  void drop(int fd);
  void expire();
  void take_resumed();
  void close_now(const std::shared_ptr<Connection>& c);
  void close_listener();  // gate thread; idempotent
  void drain_step();      // gate thread, while draining

  GateLimits limits_;
  Dispatch dispatch_;
  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1, spare_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};       // begin_drain() was called
  std::atomic<bool> drain_started_{false};  // the gate thread has stopped listening
  std::atomic<int> partial_{0};             // draining: requests part-read in the gate
  std::atomic<int> dispatched_{0};          // connections with a handler
  std::atomic<int> open_{0};
  size_t buffered_ = 0;  // bytes held by connections in the gate (gate thread only)
  std::unordered_map<int, std::shared_ptr<Connection>> conns_;  // in the gate (gate thread only)
  std::mutex resumed_mu_;
  std::deque<std::shared_ptr<Connection>> resumed_;
  bool finished_ = false;  // run() has returned (under resumed_mu_)
};

// A plain HTTP/1.1 response with the server's JSON error envelope (for answers the gate writes).
std::string gate_error_response(int status, const std::string& message);

}  // namespace atom::server
