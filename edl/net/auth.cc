#include "edl/net/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <glog/logging.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "edl/proto/frame.h"

namespace edl::net {

static_assert(SessionMac::kTagBytes == proto::kSealTagBytes);

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

constexpr char kMakeSecret[] =
    "create one with `head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE` (or let "
    "scripts/ssh_cluster.sh make it) and copy it to every node with `scp -p`";

// Reads all of `fd` (at most `limit` + 1 bytes, so an oversized file is noticed).
bool ReadAll(int fd, size_t limit, std::string* out) {
  char buf[4096];
  while (out->size() <= limit) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    out->append(buf, static_cast<size_t>(n));
  }
  return true;
}

bool ReadUrandom(unsigned char* buf, size_t n) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < n) {
    const ssize_t r = ::read(fd, buf + off, n - off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    off += static_cast<size_t>(r);
  }
  ::close(fd);
  return off == n;
}

}  // namespace

std::string DefaultSecretFile() {
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.edl/secret";
}

namespace {

// The checks every key file gets (a regular file of this user's, mode 0600 or stricter, at most
// 4096 bytes, of at least kMinSecretBytes random-looking bytes after trailing whitespace), its
// errors naming `flag` and the fix `make`.
Status ReadKeyFile(const std::string& path, const std::string& flag, const char* make,
                   std::string* key) {
  if (path.empty()) {
    return Status::InvalidArgument(flag + " is required: " + make);
  }
  const std::string what = flag + " " + path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return Status::InvalidArgument(what + ": cannot read the file (" + std::strerror(errno) +
                                   "); check the path and permissions, or " + make);
  }
  struct stat st {};
  std::string s;
  const bool read_ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ReadAll(fd, 4096, &s);
  ::close(fd);
  if (!read_ok) {
    return Status::InvalidArgument(what + ": not a readable regular file; " + make);
  }
  if (st.st_uid != ::geteuid()) {
    return Status::InvalidArgument(what + ": owned by uid " + std::to_string(st.st_uid) +
                                   ", not by this user (uid " + std::to_string(::geteuid()) +
                                   "); copy it to a file of your own with mode 0600");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::InvalidArgument(what + ": mode " + mode +
                                   " lets other users read or change the secret it holds; run "
                                   "`chmod 600 " +
                                   path + "`");
  }
  if (s.size() > 4096) {
    return Status::InvalidArgument(what + ": larger than 4096 bytes; " + make);
  }
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) {
    s.pop_back();
  }
  if (s.size() < kMinSecretBytes) {
    return Status::InvalidArgument(what + ": the secret is " + std::to_string(s.size()) +
                                   " bytes, at least " + std::to_string(kMinSecretBytes) +
                                   " are required; " + make);
  }
  bool seen[256] = {};
  size_t distinct = 0;
  for (unsigned char c : s) {
    if (!seen[c]) ++distinct;
    seen[c] = true;
  }
  if (distinct < kMinSecretDistinctBytes) {
    return Status::InvalidArgument(what + ": the secret has only " + std::to_string(distinct) +
                                   " distinct byte values, it is not random; " + make);
  }
  *key = std::move(s);
  return Status::OK();
}

}  // namespace

Status ReadSecretFile(const std::string& path, std::string* secret) {
  return ReadKeyFile(path, "--secret_file", kMakeSecret, secret);
}

Status ReadTokenFile(const std::string& path, const std::string& flag, std::string* token) {
  return ReadKeyFile(path, flag,
                     "create one with `head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE`",
                     token);
}

std::string NewNonce() {
  unsigned char buf[32];
  if (RAND_bytes(buf, sizeof(buf)) != 1 && !ReadUrandom(buf, sizeof(buf))) {
    LOG(FATAL) << "no randomness: OpenSSL RAND_bytes failed and /dev/urandom cannot be read; "
                  "without fresh nonces the cluster secret could be replayed. Fix the system's "
                  "entropy source (is /dev/urandom present in this container?)";
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

namespace {

// C(m): `m` without "mac", compact, keys sorted (nlohmann objects are ordered maps), so both
// ends compute the same text from the same values.
std::string Canonical(const nlohmann::json& m) {
  nlohmann::json j = m;
  if (j.is_object()) j.erase("mac");
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string HelloMac(const std::string& secret, const std::string& server_nonce,
                     const nlohmann::json& hello) {
  return HmacHex(secret, "edl-peer:" + server_nonce + ":" + Canonical(hello));
}

std::string WelcomeMac(const std::string& secret, const std::string& peer_nonce,
                       const nlohmann::json& welcome) {
  return HmacHex(secret, "edl-server:" + peer_nonce + ":" + Canonical(welcome));
}

std::string ServerErrorMac(const std::string& secret, const std::string& peer_nonce,
                           const std::string& code, const std::string& message) {
  return HmacHex(secret, "edl-server-error:" + peer_nonce + ":" + code + ":" + message);
}

bool MacEqual(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// ---- SessionMac

SessionMac::SessionMac(const std::string& secret, const std::string& server_nonce,
                       const std::string& peer_nonce, bool server_side) {
  const std::string label = "edl-session:" + server_nonce + ":" + peer_nonce;
  unsigned char key[EVP_MAX_MD_SIZE];
  unsigned int key_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(label.data()), label.size(), key, &key_len);
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  CHECK(mac != nullptr) << "OpenSSL has no HMAC";
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  for (Direction* d : {&out_, &in_}) {
    d->ctx = EVP_MAC_CTX_new(mac);
    CHECK(d->ctx != nullptr && EVP_MAC_init(d->ctx, key, key_len, params) == 1)
        << "OpenSSL HMAC-SHA256 init failed";
  }
  EVP_MAC_free(mac);  // the contexts hold their own references
  OPENSSL_cleanse(key, sizeof(key));
  out_.dir = server_side ? 0x01 : 0x02;
  in_.dir = server_side ? 0x02 : 0x01;
}

SessionMac::~SessionMac() {
  EVP_MAC_CTX_free(out_.ctx);
  EVP_MAC_CTX_free(in_.ctx);
}

void SessionMac::Compute(Direction* d, const char* header, const char* payload, size_t size,
                         unsigned char* out) {
  unsigned char prefix[9];
  prefix[0] = d->dir;
  for (int i = 0; i < 8; ++i) prefix[1 + i] = static_cast<unsigned char>(d->seq >> (56 - 8 * i));
  size_t len = 0;
  // Re-init with a null key restarts the HMAC under the key already set (no key schedule).
  const auto* h = reinterpret_cast<const unsigned char*>(header);
  const auto* p = reinterpret_cast<const unsigned char*>(payload);
  const bool ok = EVP_MAC_init(d->ctx, nullptr, 0, nullptr) == 1 &&
                  EVP_MAC_update(d->ctx, prefix, sizeof(prefix)) == 1 &&
                  EVP_MAC_update(d->ctx, h, proto::kFrameHeaderBytes) == 1 &&
                  EVP_MAC_update(d->ctx, p, size) == 1 &&
                  EVP_MAC_final(d->ctx, out, &len, kTagBytes) == 1 && len == kTagBytes;
  CHECK(ok) << "OpenSSL HMAC-SHA256 failed";
}

void SessionMac::Seal(const char* header, const char* payload, size_t size, char* tag) {
  Compute(&out_, header, payload, size, reinterpret_cast<unsigned char*>(tag));
  ++out_.seq;
}

bool SessionMac::Open(const char* header, const char* payload, size_t size, const char* tag) {
  unsigned char want[kTagBytes];
  Compute(&in_, header, payload, size, want);
  if (CRYPTO_memcmp(want, tag, kTagBytes) != 0) return false;
  ++in_.seq;
  return true;
}

}  // namespace edl::net
