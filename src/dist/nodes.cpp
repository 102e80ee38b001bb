#include "dist/nodes.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace atom {

int node_of_rank(int rank, int world, int nnodes, int leader) {
  ATOM_CHECK(nnodes >= 1 && world % nnodes == 0, "{} ranks over {} nodes", world, nnodes);
  const int per = world / nnodes;
  return ((rank / per - leader / per) % nnodes + nnodes) % nnodes;
}

// Requests: op byte ('S' set, 'G' get, 'A' add) then the key and the value (a Wire), one frame.
TcpStoreServer::TcpStoreServer(const std::string& host, int port) : listener_(host, port) {
  accept_thread_ = std::thread([this] {
    for (;;) {
      Socket s;
      try {
        s = listener_.accept();
      } catch (const Error&) {
        return;  // closed
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      clients_.emplace_back(
          [this, sp = std::make_shared<Socket>(std::move(s))]() mutable { serve(std::move(*sp)); });
    }
  });
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (Socket* s : sockets_) s->shutdown();
  }
  cv_.notify_all();
  listener_.close();
  accept_thread_.join();
  for (auto& t : clients_) t.join();
}

void TcpStoreServer::serve(Socket s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    sockets_.push_back(&s);
  }
  try {
    for (;;) {
      Wire req(s.recv_frame());
      const std::string op = req.str(), key = req.str(), value = req.str();
      std::string reply;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (op == "S") {
          data_[key] = value;
          cv_.notify_all();
        } else if (op == "G") {  // value: the wait's limit in milliseconds
          const auto limit = std::chrono::milliseconds(std::stoll(value));
          cv_.wait_for(lock, limit, [&] { return stop_ || data_.count(key); });
          if (stop_) break;
          Wire r;
          r.put_i64(data_.count(key) ? 1 : 0);
          r.put_str(data_.count(key) ? data_[key] : std::string());
          reply = r.buffer();
        } else if (op == "A") {
          const int64_t n = (data_.count(key) ? std::stoll(data_[key]) : 0) + std::stoll(value);
          data_[key] = std::to_string(n);
          reply = data_[key];
          cv_.notify_all();
        } else {
          break;  // not a store client
        }
      }
      s.send_frame(reply);
    }
  } catch (const std::exception&) {
    // The client left (or sent garbage): its connection ends, the store serves the others.
  }
  std::lock_guard<std::mutex> lock(mu_);
  sockets_.erase(std::find(sockets_.begin(), sockets_.end(), &s));
}

TcpStore::TcpStore(std::string host, int port, double timeout_s)
    : host_(std::move(host)), port_(port), timeout_s_(timeout_s) {}

std::string TcpStore::call(const std::string& request) {
  Socket s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      s = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!s.valid()) s = Socket::connect(host_, port_, timeout_s_);
  s.send_frame(request);
  std::string reply = s.recv_frame();
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(s));
  return reply;
}

namespace {
std::string store_request(const char* op, const std::string& key, const std::string& value) {
  Wire w;
  w.put_str(op);
  w.put_str(key);
  w.put_str(value);
  return w.buffer();
}
}  // namespace

void TcpStore::set(const std::string& key, const std::string& value) {
  call(store_request("S", key, value));
}

std::string TcpStore::get(const std::string& key) { return get(key, timeout_s_); }

std::string TcpStore::get(const std::string& key, double timeout_s) {
  Wire r(call(store_request("G", key, std::to_string(static_cast<int64_t>(timeout_s * 1000)))));
  if (r.i64() == 0) fail("'{}' was not set within {} s", key, timeout_s);
  return r.str();
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return std::stoll(call(store_request("A", key, std::to_string(delta))));
}

Nodes::Nodes(const NodeOptions& o) : o_(o) {
  if (o.nnodes < 1) fail("--nnodes must be at least 1, got {}", o.nnodes);
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    fail("--node-rank {} is outside [0, {}) for --nnodes {}", o.node_rank, o.nnodes, o.nnodes);
  if (o.master_port < 1 || o.master_port > 65535)
    fail("--master-port {} is outside [1, 65535]", o.master_port);
  if (o.node_rank == 0) server_ = std::make_unique<TcpStoreServer>(o.master_addr, o.master_port);
  store_ = std::make_unique<TcpStore>(o.master_addr, o.master_port, o.timeout_s);
  // The listener on the interface this node reaches node 0 through (loopback on one host).
  const std::string host = Socket::connect(o.master_addr, o.master_port, o.timeout_s).local_host();
  listener_ = std::make_unique<Listener>(host, 0);
  accept_thread_ = std::thread([this] { accept_loop(); });
  try {
    join(host);
  } catch (...) {
    stop();  // no destructor runs for a constructor that throws: the thread must end here
    throw;
  }
}

void Nodes::join(const std::string& host) {
  const NodeOptions& o = o_;
  store_->set(fmt::format("atom/node/{}", o.node_rank),
              fmt::format("{}:{}", host, listener_->port()));
  const int64_t joined = store_->add("atom/joined", 1);
  log_info("node {} of {}: listening on {}:{} ({} joined so far)", o.node_rank, o.nnodes, host,
           listener_->port(), joined);
  for (int n = 0; n < o.nnodes; ++n) {
    try {
      store_->get(fmt::format("atom/node/{}", n));
    } catch (const Error&) {
      fail("node {} did not join within {} s (--nnodes {}, --master-addr {}, --master-port {})", n,
           o.timeout_s, o.nnodes, o.master_addr, o.master_port);
    }
  }
  joined_ = true;
}

Nodes::~Nodes() { stop(); }

void Nodes::stop() {
  if (!accept_thread_.joinable()) return;
  // Node 0 serves the store: it waits (a while) for the others to leave before it goes.
  if (o_.nnodes > 1 && joined_) {
    try {
      if (o_.node_rank != 0) {
        store_->add("atom/left", 1);
      } else {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (store_->add("atom/left", 0) < o_.nnodes - 1 &&
               std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    } catch (const Error&) {
      // The store is gone: nothing to wait for.
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  listener_->close();
  accept_thread_.join();
}

void Nodes::accept_loop() {
  for (;;) {
    Socket s;
    try {
      s = listener_->accept();
      Wire hello(s.recv_frame());
      const std::string channel = hello.str();
      const int from = static_cast<int>(hello.i64());
      std::lock_guard<std::mutex> lock(mu_);
      accepted_[{channel, from}] = std::move(s);
      cv_.notify_all();
    } catch (const Error&) {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
  }
}

Socket Nodes::connect(const std::string& channel, int peer) {
  ATOM_CHECK(peer >= 0 && peer < size() && peer != rank(), "node {} connecting to node {}", rank(),
             peer);
  if (rank() > peer) {
    const std::string addr = store_->get(fmt::format("atom/node/{}", peer));
    const size_t colon = addr.rfind(':');
    Socket s =
        Socket::connect(addr.substr(0, colon), std::stoi(addr.substr(colon + 1)), o_.timeout_s);
    Wire hello;
    hello.put_str(channel);
    hello.put_i64(rank());
    s.send_frame(hello.buffer());
    return s;
  }
  std::unique_lock<std::mutex> lock(mu_);
  const auto key = std::make_pair(channel, peer);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(o_.timeout_s),
                    [&] { return stop_ || accepted_.count(key); }) ||
      stop_)
    fail("node {}: node {} did not open channel '{}' within {:.0f} s", rank(), peer, channel,
         o_.timeout_s);
  Socket s = std::move(accepted_[key]);
  accepted_.erase(key);
  return s;
}

std::vector<std::string> Nodes::all_gather(const std::string& name, const std::string& value) {
  int round = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = rounds_[name]++;
  }
  const std::string prefix = fmt::format("atom/gather/{}/{}/", name, round);
  store_->set(prefix + std::to_string(rank()), value);
  std::vector<std::string> all;
  for (int n = 0; n < size(); ++n) all.push_back(store_->get(prefix + std::to_string(n)));
  return all;
}

int64_t Nodes::min_over_nodes(const std::string& name, int64_t value) {
  int64_t m = value;
  for (const std::string& v : all_gather(name, std::to_string(value)))
    m = std::min<int64_t>(m, std::stoll(v));
  return m;
}

int64_t Nodes::max_over_nodes(const std::string& name, int64_t value) {
  int64_t m = value;
  for (const std::string& v : all_gather(name, std::to_string(value)))
    m = std::max<int64_t>(m, std::stoll(v));
  return m;
}

void Nodes::check_same(const std::string& name, const std::string& text) {
  const std::vector<std::string> all = all_gather(name, text);
  for (int n = 1; n < size(); ++n)
    if (all[static_cast<size_t>(n)] != all[0])
      fail("node {} was started with other {} than node 0: '{}' against '{}'", n, name,
           all[static_cast<size_t>(n)], all[0]);
}

void wire_put_tensor(Wire& w, const Tensor& t) {
  w.put_i64(t.defined() ? 1 : 0);
  if (!t.defined()) return;
  w.put_i64(static_cast<int64_t>(t.dtype()));
  w.put_i64(t.dim());
  for (int64_t d : t.shape()) w.put_i64(d);
  if (t.device().is_cpu() && t.is_contiguous()) {
    w.put_bytes(t.data(), t.nbytes());
  } else {
    Tensor c = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
    c.copy_from(t);
    w.put_bytes(c.data(), c.nbytes());
  }
}

Tensor wire_tensor(Wire& w) {
  if (w.i64() == 0) return Tensor();
  const int64_t dt = w.i64();
  if (dt < 0 || dt > static_cast<int64_t>(DType::kC64)) fail("a tensor of dtype code {}", dt);
  const int64_t nd = w.i64();
  if (nd < 0 || nd > 8) fail("a tensor of {} dimensions", nd);
  Shape shape;
  for (int64_t i = 0; i < nd; ++i) {
    shape.push_back(w.i64());
    if (shape.back() < 0) fail("a tensor of shape dimension {}", shape.back());
  }
  Tensor t = Tensor::empty(shape, static_cast<DType>(dt), Device::cpu());
  w.bytes(t.data(), t.nbytes());
  return t;
}

}  // namespace atom
