#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace atom::server {

bool ConnectionProbe::matches(int fd) const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  char buf[INET6_ADDRSTRLEN] = {0};
  int port = -1;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  return port == port_ && addr_ == buf;
}

bool ConnectionProbe::closed() {
  if (fd_ < 0 || !matches(fd_)) {
    fd_ = -1;
    DIR* d = opendir("/proc/self/fd");
    if (!d) return false;
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (*end != '\0' || fd < 0) continue;
      struct stat st {};
      if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      if (matches(static_cast<int>(fd))) {
        fd_ = static_cast<int>(fd);
        break;
      }
    }
    closedir(d);
    if (fd_ < 0) return false;
  }
  char c;
  const ssize_t r = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0) return true;  // orderly shutdown by the peer
  if (r < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return false;  // data waiting (a pipelined request): alive
}

}  // namespace atom::server
