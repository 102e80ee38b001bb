#include "loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace atom {

using json = nlohmann::json;

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

namespace {

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t file_size_of(int fd, const std::string& path) {
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

void read_exact(int fd, uint8_t* dst, uint64_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t r = pread(fd, dst, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("{}: read failed: {}", path, std::strerror(errno));
    }
    if (r == 0) fail("{}: unexpected end of file", path);
    dst += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

struct Fd {
  int fd;
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  }
  ~Fd() { ::close(fd); }
};

}  // namespace

SafetensorsHeader safetensors_parse_header(const std::string& path, const uint8_t* bytes,
                                           uint64_t available, uint64_t file_size) {
  SafetensorsHeader h;
  h.file_size = file_size;
  if (file_size < 8 || available < 8)
    fail("{}: not a safetensors file: {} bytes is smaller than the 8-byte header length", path,
         file_size);
  const uint64_t n = read_u64_le(bytes);
  if (n > kSafetensorsMaxHeader)
    fail("{}: header length {} exceeds the limit of {} bytes", path, n, kSafetensorsMaxHeader);
  if (n > file_size - 8)
    fail("{}: header length {} runs past the end of the {}-byte file", path, n, file_size);
  ATOM_CHECK(available >= 8 + n, "{}: header not fully read", path);
  h.header_len = n;
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  if (n == 0 || text[0] != '{') fail("{}: header does not start with '{{'", path);
  json j;
  try {
    j = json::parse(text, text + n);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) fail("{}: header is not a JSON object", path);

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ is not an object", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail("{}: __metadata__ value for '{}' is not a string", path, m.key());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      fail("{}: tensor '{}': entry needs dtype, shape and data_offsets", path, name);
    SafetensorsEntry e;
    e.name = name;
    if (!v["dtype"].is_string()) fail("{}: tensor '{}': dtype is not a string", path, name);
    const auto dt = dtype_from_safetensors(v["dtype"].get<std::string>());
    if (!dt) fail("{}: tensor '{}': unknown dtype '{}'", path, name, v["dtype"].get<std::string>());
    e.dtype = *dt;
    if (!v["shape"].is_array()) fail("{}: tensor '{}': shape is not a list", path, name);
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned())
        fail("{}: tensor '{}': shape {} is not a list of non-negative integers", path, name,
             v["shape"].dump());
      if (d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        fail("{}: tensor '{}': shape {} has a dimension over 2^63 - 1", path, name,
             v["shape"].dump());
      e.shape.push_back(d.get<int64_t>());
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      fail("{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    h.entries.push_back(std::move(e));
  }

  std::sort(h.entries.begin(), h.entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected_begin = 0;
  const uint64_t data_size = file_size - 8 - n;  // n <= file_size - 8, checked above
  for (const auto& e : h.entries) {
    if (e.end > data_size)
      fail("{}: tensor '{}': data_offsets [{}, {}) run past the {} data bytes of the file", path,
           e.name, e.begin, e.end, data_size);
    if (e.begin != expected_begin || e.end < e.begin)
      fail("{}: tensor '{}': invalid data_offsets [{}, {}): tensors must be contiguous and "
           "non-overlapping (expected it to start at {})",
           path, e.name, e.begin, e.end, expected_begin);
    // elements x dtype bits must not overflow and must fill whole bytes.
    uint64_t elems = 1;
    for (int64_t d : e.shape) {
      const uint64_t ud = static_cast<uint64_t>(d);
      if (ud != 0 && elems > UINT64_MAX / ud)
        fail("{}: tensor '{}': shape {} overflows", path, e.name, shape_str(e.shape));
      elems *= ud;
    }
    if (elems > static_cast<uint64_t>(INT64_MAX))
      fail("{}: tensor '{}': shape {} has more than 2^63 - 1 elements", path, e.name,
           shape_str(e.shape));
    const uint64_t bits = static_cast<uint64_t>(dtype_bits(e.dtype));
    if (elems != 0 && elems > UINT64_MAX / bits)
      fail("{}: tensor '{}': shape {} overflows", path, e.name, shape_str(e.shape));
    if ((elems * bits) % 8 != 0)
      fail("{}: tensor '{}': {} elements of {} do not fill whole bytes", path, e.name, elems,
           dtype_name(e.dtype));
    const uint64_t want = elems * bits / 8;
    if (e.end - e.begin != want)
      fail("{}: tensor '{}': data_offsets hold {} bytes but shape {} of {} needs {}", path, e.name,
           e.end - e.begin, shape_str(e.shape), dtype_name(e.dtype), want);
    expected_begin = e.end;
  }
  if (expected_begin + 8 + n != file_size)
    fail("{}: file is {} bytes but header and tensors account for {} (truncated or trailing "
         "bytes)",
         path, file_size, expected_begin + 8 + n);
  return h;
}

SafetensorsHeader safetensors_read_header(const std::string& path) {
  Fd f(path);
  const uint64_t size = file_size_of(f.fd, path);
  if (size < 8) return safetensors_parse_header(path, nullptr, 0, size);
  uint8_t len_bytes[8];
  read_exact(f.fd, len_bytes, 8, 0, path);
  const uint64_t n = read_u64_le(len_bytes);
  if (n > kSafetensorsMaxHeader || n > size - 8)
    return safetensors_parse_header(path, len_bytes, 8, size);  // reports the error
  std::vector<uint8_t> buf(8 + n);
  std::memcpy(buf.data(), len_bytes, 8);
  read_exact(f.fd, buf.data() + 8, n, 8, path);
  return safetensors_parse_header(path, buf.data(), buf.size(), size);
}

SafetensorsFile::SafetensorsFile(std::string path, bool use_mmap) : path_(std::move(path)) {
  Fd f(path_);
  const uint64_t size = file_size_of(f.fd, path_);
  if (use_mmap && size > 0) {
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f.fd, 0);
    if (p == MAP_FAILED) fail("{}: mmap failed: {}", path_, std::strerror(errno));
    mapping_ = std::shared_ptr<void>(p, [size](void* q) { munmap(q, size); });
  } else {
    auto* buf = static_cast<uint8_t*>(std::malloc(size ? size : 1));
    if (!buf) fail("{}: out of memory reading {} bytes", path_, size);
    mapping_ = std::shared_ptr<void>(buf, [](void* q) { std::free(q); });
    read_exact(f.fd, buf, size, 0, path_);
  }
  base_ = static_cast<const uint8_t*>(mapping_.get());
  header_ = safetensors_parse_header(path_, base_, size, size);
}

SafetensorsFile::~SafetensorsFile() = default;

Tensor SafetensorsFile::tensor(const SafetensorsEntry& e) const {
  void* p = const_cast<uint8_t*>(base_ + header_.data_start() + e.begin);
  return Tensor::wrap(p, e.shape, e.dtype, Device::cpu(), mapping_);
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry* e = header_.find(name);
  if (!e) fail("{}: no tensor named '{}'", path_, name);
  return tensor(*e);
}

void safetensors_write(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<Tensor> cpu;
  for (const auto& [name, t] : tensors) {
    Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu());
    h[name] = {{"dtype", dtype_name(c.dtype())},
               {"shape", c.shape()},
               {"data_offsets", {off, off + c.nbytes()}}};
    off += c.nbytes();
    cpu.push_back(std::move(c));
  }
  std::string text = h.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot open for writing", path);
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& c : cpu)
    out.write(static_cast<const char*>(c.data()), static_cast<std::streamsize>(c.nbytes()));
  if (!out) fail("{}: write failed", path);
}

}  // namespace atom
