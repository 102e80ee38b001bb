#include "dist/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace atom {

namespace {

std::string errno_text() { return std::strerror(errno); }

// The IPv4 address of `host` (a name or a dotted quad).
sockaddr_in resolve(const std::string& host, int port) {
  if (port < 0 || port > 65535) fail("port {} is outside [0, 65535]", port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) fail("cannot resolve host '{}': {}", host, ::gai_strerror(rc));
  sockaddr_in a{};
  std::memcpy(&a, res->ai_addr, sizeof(a));
  ::freeaddrinfo(res);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket::Socket(Socket&& o) noexcept : fd_(o.fd_), peer_(std::move(o.peer_)) { o.fd_ = -1; }

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    peer_ = std::move(o.peer_);
    o.fd_ = -1;
  }
  return *this;
}

Socket Socket::connect(const std::string& host, int port, double timeout_s) {
  const sockaddr_in a = resolve(host, port);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const std::string peer = fmt::format("{}:{}", host, port);
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("socket(): {}", errno_text());
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Socket(fd, peer);
    }
    const int err = errno;
    ::close(fd);
    if ((err != ECONNREFUSED && err != ETIMEDOUT && err != EHOSTUNREACH) ||
        std::chrono::steady_clock::now() >= deadline)
      fail("cannot connect to {} within {:.0f} s: {}", peer, timeout_s, std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void Socket::send_all(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("connection to {} lost while sending: {}", peer_, errno_text());
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void Socket::recv_all(void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd_, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) fail("connection to {} closed by the peer", peer_);
    if (k < 0) fail("connection to {} lost while receiving: {}", peer_, errno_text());
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void Socket::send_frame(std::string_view bytes) {
  const uint64_t n = bytes.size();
  std::string buf(sizeof(n) + bytes.size(), '\0');
  std::memcpy(buf.data(), &n, sizeof(n));
  if (!bytes.empty()) std::memcpy(buf.data() + sizeof(n), bytes.data(), bytes.size());
  send_all(buf.data(), buf.size());
}

std::string Socket::recv_frame() {
  uint64_t n = 0;
  recv_all(&n, sizeof(n));
  // A frame carries at most a step's tensors; a larger length is a corrupt or foreign stream.
  if (n > (uint64_t{16} << 30)) fail("connection to {}: a frame of {} bytes", peer_, n);
  std::string s(n, '\0');
  recv_all(s.data(), n);
  return s;
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

std::string Socket::local_host() const {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    fail("getsockname(): {}", errno_text());
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
  return text;
}

Listener::Listener(const std::string& host, int port) {
  const sockaddr_in a = resolve(host, port);
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) fail("socket(): {}", errno_text());
  const int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(fd_, 64) != 0) {
    const std::string e = errno_text();
    ::close(fd_);
    fd_ = -1;
    fail("cannot listen on {}:{}: {}", host, port, e);
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.sin_port);
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

Socket Listener::accept() {
  for (;;) {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&a), &len, SOCK_CLOEXEC);
    if (fd >= 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
      return Socket(fd, fmt::format("{}:{}", text, ntohs(a.sin_port)));
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    fail("listener on port {} closed: {}", port_, errno_text());
  }
}

void Listener::close() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void Wire::put_i64(int64_t v) { put_bytes(&v, sizeof(v)); }

void Wire::put_str(std::string_view s) {
  put_i64(static_cast<int64_t>(s.size()));
  put_bytes(s.data(), s.size());
}

void Wire::put_bytes(const void* p, size_t n) {
  if (n > 0) buf_.append(static_cast<const char*>(p), n);  // an empty vector's data() may be null
}

int64_t Wire::i64() {
  int64_t v = 0;
  bytes(&v, sizeof(v));
  return v;
}

std::string Wire::str() {
  const int64_t n = i64();
  if (n < 0 || static_cast<size_t>(n) > buf_.size() - at_)
    fail("a message between nodes is cut short (a string of {} bytes)", n);
  std::string s = buf_.substr(at_, static_cast<size_t>(n));
  at_ += static_cast<size_t>(n);
  return s;
}

void Wire::bytes(void* p, size_t n) {
  if (n > buf_.size() - at_) fail("a message between nodes is cut short ({} bytes missing)", n);
  if (n == 0) return;  // p may be null (an empty vector's data())
  std::memcpy(p, buf_.data() + at_, n);
  at_ += n;
}

}  // namespace atom
