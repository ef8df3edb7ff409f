#include "edl/net/auth.h"

#include <fstream>
#include <sstream>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace edl::net {
namespace {

std::string ToHex(const unsigned char* p, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 15];
  }
  return out;
}

}  // namespace

Status ReadSecretFile(const std::string& path, std::string* secret) {
  if (path.empty()) {
    return Status::InvalidArgument(
        "--secret_file is required: create one with `head -c 32 /dev/urandom | base64 > edl.secret; "
        "chmod 600 edl.secret` and copy it to every node");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::InvalidArgument("--secret_file " + path +
                                   ": cannot read the file; check the path and permissions");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) {
    s.pop_back();
  }
  if (s.size() < 16) {
    return Status::InvalidArgument("--secret_file " + path + ": the secret is shorter than 16 bytes; "
                                   "use `head -c 32 /dev/urandom | base64`");
  }
  *secret = std::move(s);
  return Status::OK();
}

std::string NewNonce() {
  unsigned char buf[32];
  if (RAND_bytes(buf, sizeof(buf)) != 1) {
    // RAND_bytes fails only when the OS entropy source is broken; fall back to /dev/urandom.
    std::ifstream in("/dev/urandom", std::ios::binary);
    in.read(reinterpret_cast<char*>(buf), sizeof(buf));
  }
  return ToHex(buf, sizeof(buf));
}

std::string HmacHex(const std::string& secret, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  return ToHex(mac, len);
}

std::string PeerMac(const std::string& secret, const std::string& role,
                    const std::string& server_nonce) {
  return HmacHex(secret, "edl-peer:" + role + ":" + server_nonce);
}

std::string ServerMac(const std::string& secret, const std::string& peer_nonce) {
  return HmacHex(secret, "edl-server:" + peer_nonce);
}

bool MacEqual(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace edl::net
