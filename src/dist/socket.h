// Blocking TCP sockets between the processes of a multi-node run (dist/nodes.h): connecting with
// retries until a deadline, listening on an ephemeral port, and length-prefixed frames. Every
// failure is an atom::Error naming the peer; a peer that closes its end makes the next read fail.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace atom {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  ~Socket();
  Socket(Socket&& o) noexcept;
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }

  // Connects to host:port, retrying refused connections until `timeout_s` passed (the peer may
  // not listen yet). TCP_NODELAY is set: frames are small and latency-bound.
  static Socket connect(const std::string& host, int port, double timeout_s);

  void send_all(const void* data, size_t n);
  void recv_all(void* data, size_t n);
  // A frame: its byte count (u64, little-endian) then the bytes.
  void send_frame(std::string_view bytes);
  std::string recv_frame();
  // Ends both directions now: a thread blocked reading this socket (here or at the peer) wakes
  // with an error. The descriptor stays open until destruction.
  void shutdown();
  // The local address of this connection ("127.0.0.1"), as the peer reaches this host.
  std::string local_host() const;

 private:
  int fd_ = -1;
  std::string peer_;
};

// A listening socket on host's interface (port 0: any free port).
class Listener {
 public:
  Listener(const std::string& host, int port);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  int port() const { return port_; }
  // The next connection; an error once close() was called.
  Socket accept();
  // Wakes a thread blocked in accept() with an error.
  void close();

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The frames' integers and strings, appended to / read from a byte string in order.
class Wire {
 public:
  Wire() = default;
  explicit Wire(std::string bytes) : buf_(std::move(bytes)) {}
  void put_i64(int64_t v);
  void put_str(std::string_view s);
  void put_bytes(const void* p, size_t n);
  int64_t i64();
  std::string str();
  void bytes(void* p, size_t n);
  bool done() const { return at_ == buf_.size(); }
  const std::string& buffer() const { return buf_; }

 private:
  std::string buf_;
  size_t at_ = 0;
};

}  // namespace atom
