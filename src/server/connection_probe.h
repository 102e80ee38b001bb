// Tells whether an HTTP client has gone away while its request waits in the engine, so the
// request can be aborted before it reaches prefill or decode. The HTTP library does not expose
// the connection's socket, so it is found by its peer address.
#pragma once

#include <string>

namespace atom::server {

class ConnectionProbe {
 public:
  ConnectionProbe(std::string remote_addr, int remote_port)
      : addr_(std::move(remote_addr)), port_(remote_port) {}
  // True when the peer has closed (or reset) the connection. A connection that cannot be found
  // counts as open: probing never aborts a live request.
  bool closed();

 private:
  bool matches(int fd) const;
  std::string addr_;
  int port_;
  int fd_ = -1;
};

}  // namespace atom::server
