#include "edl/runtime/comm/file_kv_store.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace edl::runtime {

std::string FileKvStore::PathOf(const std::string& key) const {
  static const char kHex[] = "0123456789ABCDEF";
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += kHex[c >> 4];
      name += kHex[c & 15];
    }
  }
  return dir_ + "/" + name;
}

Status FileKvStore::Set(const std::string& key, const std::string& value) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return Status::IOError("rendezvous directory " + dir_ + ": " + ec.message());
  const std::string path = PathOf(key);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.flush();
    if (!out) return Status::IOError("cannot write rendezvous file " + tmp + "; is the disk full?");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return PosixError("rename " + tmp, errno);
  return Status::OK();
}

Status FileKvStore::Get(const std::string& key, std::string* value) {
  std::ifstream in(PathOf(key), std::ios::binary);
  if (!in) return Status::NotFound("rendezvous key '" + key + "' is not set in " + dir_);
  std::ostringstream buf;
  buf << in.rdbuf();
  *value = buf.str();
  return Status::OK();
}

Status FileKvStore::Wait(const std::string& key, std::chrono::milliseconds timeout,
                         std::string* value) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds pause(1);
  for (;;) {
    Status s = Get(key, value);
    if (!s.IsNotFound()) return s;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout("rendezvous key '" + key + "' did not appear in " + dir_ + " within " +
                             std::to_string(timeout.count()) +
                             " ms; did every rank start with the same directory?");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(10));
  }
}

}  // namespace edl::runtime
