#include "server/connection_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/log.h"
#include "server/http_server.h"

namespace atom::server {

namespace {

using Clock = std::chrono::steady_clock;

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A header value for a message: at most 40 characters, control bytes shown as '?'.
std::string shown(std::string_view v) {
  std::string out;
  for (char c : v.substr(0, 40))
    out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (v.size() > 40) out += "...";
  return out;
}

bool is_token_char(char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = lower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

const char* reason(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

// Best effort: the gate never blocks on a client.
void send_now(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;
    }
  }
}

}  // namespace

// ---- RequestFramer ----

RequestFramer::State RequestFramer::fail(int status, std::string message) {
  state_ = State::kError;
  status_ = status;
  message_ = std::move(message);
  return state_;
}

RequestFramer::State RequestFramer::parse_headers(std::string_view head) {
  // The request line: METHOD SP TARGET SP VERSION.
  size_t eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == 0 || sp2 == std::string_view::npos || sp2 == sp1 + 1 ||
      line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "Malformed request line");
  for (size_t i = 0; i < sp1; ++i)
    if (!is_token_char(line[i])) return fail(400, "Malformed request line");
  if (line.substr(sp2 + 1, 7) != "HTTP/1.")
    return fail(400, "Malformed request line: not HTTP/1.x");
  method_ = std::string(line.substr(0, sp1));
  target_ = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  for (char c : line)
    if (c == '\r' || c == '\n' || c == '\0') return fail(400, "Malformed request line");

  bool have_length = false;
  while (eol != std::string_view::npos) {
    const size_t start = eol + 2;
    eol = head.find("\r\n", start);
    const std::string_view field =
        head.substr(start, eol == std::string_view::npos ? head.size() - start : eol - start);
    // Bare CR or LF, NUL, or an obsolete line fold could be read differently by the parser
    // behind the gate: refused.
    if (field.empty() || field.front() == ' ' || field.front() == '\t')
      return fail(400, "Malformed header line (line folding is not allowed)");
    for (char c : field)
      if (c == '\r' || c == '\n' || c == '\0')
        return fail(400, "Malformed header line (bare CR, LF or NUL)");
    const size_t colon = field.find(':');
    if (colon == std::string_view::npos || colon == 0)
      return fail(400, "Malformed header line (no field name)");
    const std::string_view name = field.substr(0, colon);
    for (char c : name)
      if (!is_token_char(c))
        return fail(400, fmt::format("Malformed header name '{}'", shown(name)));
    const std::string_view value = trim(field.substr(colon + 1));
    if (iequals(name, "content-length")) {
      uint64_t n = 0;
      bool ok = !value.empty();
      for (char c : value) {
        if (c < '0' || c > '9') {
          ok = false;
          break;
        }
        // Saturates: any length past 10^18 is over every body limit.
        n = n > 100000000000000000ull ? 1000000000000000000ull
                                      : n * 10 + static_cast<uint64_t>(c - '0');
      }
      if (!ok) return fail(400, fmt::format("Invalid Content-Length header: '{}'", shown(value)));
      if (have_length && n != content_length_)
        return fail(400, "Conflicting Content-Length headers");
      have_length = true;
      content_length_ = n;
    } else if (iequals(name, "transfer-encoding")) {
      if (!iequals(value, "chunked"))
        return fail(501, fmt::format("Unsupported Transfer-Encoding '{}' (only chunked is served)",
                                     shown(value)));
      if (chunked_) return fail(400, "Repeated Transfer-Encoding header");
      chunked_ = true;
    } else if (iequals(name, "expect")) {
      expect_continue_ = iequals(value, "100-continue");
    }
  }
  if (chunked_ && have_length)
    return fail(400, "A request may not have both Content-Length and Transfer-Encoding");
  if (content_length_ > max_body_)
    return fail(
        413,
        fmt::format("Request body too large: Content-Length {} exceeds the limit of {} bytes "
                    "(--max-request-body-bytes)",
                    content_length_ >= 1000000000000000000ull ? std::string(">= 10^18")
                                                              : std::to_string(content_length_),
                    max_body_));
  return state_;
}

RequestFramer::State RequestFramer::feed_chunked(std::string_view bytes) {
  while (pos_ < bytes.size()) {
    switch (chunk_) {
      case Chunk::kSize: {
        const size_t e = bytes.find("\r\n", pos_);
        const size_t len = (e == std::string_view::npos ? bytes.size() : e) - pos_;
        if (len > 1024)
          return fail(400, "Malformed chunked body: chunk size line longer than 1024 bytes");
        if (e == std::string_view::npos) return state_;
        const std::string_view line = bytes.substr(pos_, len);
        uint64_t size = 0;
        size_t i = 0;
        for (; i < line.size() && hex_value(line[i]) >= 0; ++i) {
          if (i >= 15) return fail(413, "Request body too large: chunk size out of range");
          size = size * 16 + static_cast<uint64_t>(hex_value(line[i]));
        }
        if (i == 0 || (i < line.size() && line[i] != ';'))
          return fail(400, fmt::format("Malformed chunked body: bad chunk size '{}'", shown(line)));
        for (char c : line)
          if (c == '\0' || c == '\r' || c == '\n')
            return fail(400, "Malformed chunked body: bad chunk size line");
        pos_ = e + 2;
        if (size == 0) {
          chunk_ = Chunk::kTrailer;
        } else {
          if (decoded_ + size > max_body_)
            return fail(
                413, fmt::format(
                         "Request body too large: the chunked body exceeds the limit of {} bytes "
                         "(--max-request-body-bytes)",
                         max_body_));
          remaining_ = size;
          chunk_ = Chunk::kData;
        }
        break;
      }
      case Chunk::kData: {
        const size_t take =
            static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size() - pos_));
        pos_ += take;
        remaining_ -= take;
        decoded_ += take;
        if (remaining_ == 0) chunk_ = Chunk::kDataEnd;
        break;
      }
      case Chunk::kDataEnd:
        if (bytes.size() - pos_ < 2) return state_;
        if (bytes.substr(pos_, 2) != "\r\n")
          return fail(400, "Malformed chunked body: chunk data not followed by CRLF");
        pos_ += 2;
        chunk_ = Chunk::kSize;
        break;
      case Chunk::kTrailer: {
        const size_t e = bytes.find("\r\n", pos_);
        if ((e == std::string_view::npos ? bytes.size() : e) - pos_ > max_header_)
          return fail(431, "Request trailer fields too large");
        if (e == std::string_view::npos) return state_;
        if (e == pos_) {
          end_ = e + 2;
          state_ = State::kComplete;
          return state_;
        }
        for (size_t k = pos_; k < e; ++k)
          if (bytes[k] == '\n' || bytes[k] == '\0') return fail(400, "Malformed trailer line");
        pos_ = e + 2;
        break;
      }
    }
    // Framing overhead (many tiny chunks) is bounded too.
    if (pos_ - header_end_ > max_body_ * 4 + (1u << 20))
      return fail(413, "Request body too large: chunked framing overhead");
  }
  return state_;
}

RequestFramer::State RequestFramer::feed(std::string_view bytes) {
  if (state_ != State::kNeedMore) return state_;
  if (header_end_ == 0) {
    const size_t from = scanned_ >= 3 ? scanned_ - 3 : 0;
    const size_t p = bytes.find("\r\n\r\n", from);
    if (p == std::string_view::npos) {
      scanned_ = bytes.size();
      if (bytes.size() > max_header_)
        return fail(431, fmt::format("Request header fields too large (the limit is {} bytes)",
                                     max_header_));
      return state_;
    }
    if (p + 4 > max_header_)
      return fail(
          431, fmt::format("Request header fields too large (the limit is {} bytes)", max_header_));
    header_end_ = p + 4;
    if (parse_headers(bytes.substr(0, p)) == State::kError) return state_;
    pos_ = header_end_;
  }
  if (chunked_) return feed_chunked(bytes);
  if (bytes.size() - header_end_ >= content_length_) {
    end_ = header_end_ + static_cast<size_t>(content_length_);
    state_ = State::kComplete;
  }
  return state_;
}

// ---- ConnectionGate ----

std::string gate_error_response(int status, const std::string& message) {
  const std::string type = status == 503 ? "ServiceUnavailableError" : "BadRequestError";
  const std::string body = error_body(status, type, message);
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: "
                     "{}\r\nConnection: close\r\n\r\n{}",
                     status, reason(status), body.size(), body);
}

ConnectionGate::ConnectionGate(GateLimits limits, Dispatch dispatch)
    : limits_(limits), dispatch_(std::move(dispatch)) {
  // Each connection is a file descriptor: take the hard limit, keep some for the model's files.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
    const auto room = static_cast<int64_t>(rl.rlim_cur) - 256;
    if (room < limits_.max_connections) {
      limits_.max_connections = static_cast<int>(std::max<int64_t>(room, 16));
      log_info("at most {} connections at once (the file descriptor limit is {})",
               limits_.max_connections, static_cast<int64_t>(rl.rlim_cur));
    }
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
}

ConnectionGate::~ConnectionGate() {
  for (auto& [fd, c] : conns_) ::close(fd);
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_, spare_fd_})
    if (fd >= 0) ::close(fd);
}

std::string ConnectionGate::listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
      rc != 0)
    return fmt::format("cannot listen on {}:{}: {}", host, port, gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    // SO_REUSEADDR lets a restarted server take a port its predecessor's closed connections still
    // name; unlike SO_REUSEPORT it never lets two servers listen on one port.
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
    break;
  }
  freeaddrinfo(res);
  if (listen_fd_ < 0) return fmt::format("cannot listen on {}:{}: {}", host, port, why);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  return "";
}

void ConnectionGate::accept_all() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd =
        accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
        // Out of descriptors: use the spare one to turn the client away instead of spinning.
        ::close(spare_fd_);
        fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          send_now(fd, gate_error_response(503, "Too many open connections"));
          ::close(fd);
        }
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        log_warn("out of file descriptors with {} connections open", open_.load());
      }
      return;  // EAGAIN: all accepted
    }
    if (open_.load() >= limits_.max_connections) {
      send_now(fd,
               gate_error_response(503, fmt::format("Too many open connections (the limit is {})",
                                                    limits_.max_connections)));
      ::close(fd);
      continue;
    }
    const int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);  // SSE events go out as written
    auto c = std::make_shared<Connection>();
    c->fd = fd;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (ss.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
      inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
      c->remote_port = ntohs(a->sin6_port);
    } else {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
      inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
      c->remote_port = ntohs(a->sin_port);
    }
    c->remote_ip = buf;
    c->framer = std::make_unique<RequestFramer>(limits_.max_header_bytes, limits_.max_body_bytes);
    c->deadline = Clock::now() + std::chrono::seconds(limits_.keep_alive_timeout_s);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    conns_[fd] = std::move(c);
    ++open_;
  }
}

void ConnectionGate::drop(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  buffered_ -= it->second->buf.size();
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  conns_.erase(it);
  --open_;
}

void ConnectionGate::reject(const std::shared_ptr<Connection>& c, int status,
                            const std::string& message) {
  send_now(c->fd, gate_error_response(status, message));
  // Half-close and read until the client closes (or 2 s), so the answer is not lost to a reset
  // caused by unread request bytes.
  ::shutdown(c->fd, SHUT_WR);
  buffered_ -= c->buf.size();
  std::string().swap(c->buf);
  c->phase = Connection::Phase::kClosing;
  c->deadline = Clock::now() + std::chrono::seconds(2);
}

void ConnectionGate::on_readable(const std::shared_ptr<Connection>& c) {
  char tmp[64 << 10];
  const ssize_t n = ::recv(c->fd, tmp, sizeof tmp, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    drop(c->fd);  // the client closed (or reset) the connection
    return;
  }
  if (c->phase == Connection::Phase::kClosing) return;  // discarded
  if (buffered_ + static_cast<size_t>(n) > limits_.max_buffered_bytes) {
    reject(c, 503, "The server is holding too many unfinished requests; try again");
    return;
  }
  c->buf.append(tmp, static_cast<size_t>(n));
  buffered_ += static_cast<size_t>(n);
  advance(c);
}

void ConnectionGate::advance(const std::shared_ptr<Connection>& c) {
  if (c->buf.empty()) return;
  const auto now = Clock::now();
  if (c->phase == Connection::Phase::kIdle) {
    c->phase = Connection::Phase::kHeaders;
    c->deadline = now + std::chrono::seconds(limits_.header_timeout_s);
  }
  const RequestFramer::State s = c->framer->feed(c->buf);
  if (s == RequestFramer::State::kError) {
    reject(c, c->framer->error_status(), c->framer->error_message());
    return;
  }
  if (c->phase == Connection::Phase::kHeaders && c->framer->headers_done()) {
    c->phase = Connection::Phase::kBody;
    c->deadline = now + std::chrono::seconds(limits_.body_timeout_s);
    if (s == RequestFramer::State::kNeedMore && c->framer->expects_continue() &&
        !c->sent_continue) {
      send_now(c->fd, "HTTP/1.1 100 Continue\r\n\r\n");
      c->sent_continue = true;
    }
  }
  if (s != RequestFramer::State::kComplete) return;
  c->request_bytes = c->framer->request_bytes();
  c->method = c->framer->method();
  c->target = c->framer->target();
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  buffered_ -= c->buf.size();
  auto keep = c;
  conns_.erase(c->fd);
  ++dispatched_;
  dispatch_(std::move(keep));
}

void ConnectionGate::expire() {
  const auto now = Clock::now();
  std::vector<std::shared_ptr<Connection>> late;
  for (auto& [fd, c] : conns_)
    if (c->deadline <= now) late.push_back(c);
  for (auto& c : late) {
    switch (c->phase) {
      case Connection::Phase::kIdle:
      case Connection::Phase::kClosing:
        drop(c->fd);
        break;
      case Connection::Phase::kHeaders:
        reject(c, 408,
               fmt::format("Request headers not received within {} s (--http-header-timeout)",
                           limits_.header_timeout_s));
        break;
      case Connection::Phase::kBody:
        reject(c, 408,
               fmt::format("Request body not received within {} s (--http-body-timeout)",
                           limits_.body_timeout_s));
        break;
    }
  }
}

void ConnectionGate::resume(std::shared_ptr<Connection> c) {
  --dispatched_;  // once draining, take_resumed closes it (one response per connection)
  c->buf.erase(0, c->request_bytes);  // the handler may have done so already (request_bytes 0)
  if (c->buf.capacity() > (64u << 10))
    std::string(c->buf).swap(c->buf);  // give a big body's memory back
  c->request_bytes = 0;
  c->framer = std::make_unique<RequestFramer>(limits_.max_header_bytes, limits_.max_body_bytes);
  c->phase = Connection::Phase::kIdle;
  c->sent_continue = false;
  c->deadline = Clock::now() + std::chrono::seconds(limits_.keep_alive_timeout_s);
  {
    std::lock_guard<std::mutex> lock(resumed_mu_);
    if (finished_) {  // run() has returned: nobody reads this connection again
      close_now(c);
      return;
    }
    resumed_.push_back(std::move(c));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
}

void ConnectionGate::close(std::shared_ptr<Connection> c) {
  close_now(c);
  --dispatched_;
}

void ConnectionGate::close_now(const std::shared_ptr<Connection>& c) {
  ::close(c->fd);
  c->fd = -1;
  --open_;
}

void ConnectionGate::take_resumed() {
  std::deque<std::shared_ptr<Connection>> batch;
  {
    std::lock_guard<std::mutex> lock(resumed_mu_);
    batch.swap(resumed_);
  }
  for (auto& c : batch) {
    if (stopping_.load() || draining_.load()) {
      close_now(c);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c->fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev);
    buffered_ += c->buf.size();
    conns_[c->fd] = c;
    advance(c);  // a pipelined request may be buffered already
  }
}

void ConnectionGate::run() {
  std::vector<epoll_event> evs(512);
  auto last_sweep = Clock::now();
  while (!stopping_.load()) {
    const int n = epoll_wait(epoll_fd_, evs.data(), static_cast<int>(evs.size()), 200);
    for (int i = 0; i < n; ++i) {
      const int fd = evs[i].data.fd;
      if (fd == listen_fd_) {
        accept_all();
      } else if (fd == wake_fd_) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof v);
        take_resumed();
      } else if (auto it = conns_.find(fd); it != conns_.end()) {
        auto c = it->second;  // on_readable may drop it
        on_readable(c);
      }
    }
    if (Clock::now() - last_sweep > std::chrono::milliseconds(200)) {
      last_sweep = Clock::now();
      expire();
    }
    if (draining_.load()) drain_step();
  }
  close_listener();
  std::vector<int> fds;
  for (auto& [fd, c] : conns_) fds.push_back(fd);
  for (int fd : fds) drop(fd);
  take_resumed();  // closes them: stopping
  std::lock_guard<std::mutex> lock(resumed_mu_);
  finished_ = true;
  for (auto& c : resumed_) close_now(c);
  resumed_.clear();
}

void ConnectionGate::close_listener() {
  if (listen_fd_ < 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  ::close(listen_fd_);
  listen_fd_ = -1;
}

void ConnectionGate::drain_step() {
  close_listener();
  // Idle connections close; a connection turned away (kClosing) finishes its 2 s linger.
  std::vector<int> idle;
  int partial = 0;
  for (auto& [fd, c] : conns_) {
    if (c->phase == Connection::Phase::kIdle) idle.push_back(fd);
    if (c->phase == Connection::Phase::kHeaders || c->phase == Connection::Phase::kBody) ++partial;
  }
  for (int fd : idle) drop(fd);
  partial_.store(partial);
  drain_started_.store(true);
}

void ConnectionGate::begin_drain() {
  draining_.store(true);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
}

void ConnectionGate::stop() {
  stopping_.store(true);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
}

}  // namespace atom::server
