// Shared-secret authentication for every TCP connection (server <-> client, server <-> ctl), and
// the session MAC that seals every frame after it.
//
// Handshake (PROTOCOL.md has the frames and the threat model):
//   server -> peer   challenge{nonce_s}                 32 fresh random bytes per connection
//   peer   -> server hello{role, mac_p, nonce_p, ...}
//                    mac_p = HMAC-SHA256(secret, "edl-peer:" nonce_s ":" C(hello))
//   server -> peer   welcome{mac_s, ...}
//                    mac_s = HMAC-SHA256(secret, "edl-server:" nonce_p ":" C(welcome))
// where C(m) is m without its "mac", as compact JSON with sorted keys: every field of both
// messages is covered, so a relay cannot change a node's name, host or slots on the way.
// The server accepts nothing but `hello` before the check passes and compares MACs in constant
// time; the peer checks mac_s, so neither side talks to an impostor. hello and welcome are the
// last unsealed frames; after them each side seals every frame it sends with SessionMac under
//   K = HMAC-SHA256(secret, "edl-session:" nonce_s ":" nonce_p)
// so a party without the secret can neither inject, replay, reorder nor alter frames.
//
// Thread-safety: free functions are reentrant. A SessionMac's Seal and Open may run on two
// threads at once (each direction has its own state); each must be serialised with itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"

typedef struct evp_mac_ctx_st EVP_MAC_CTX;

namespace edl::net {

// Minimum secret length and distinct byte values (32 random bytes as base64 or hex have 13+).
constexpr size_t kMinSecretBytes = 32;
constexpr size_t kMinSecretDistinctBytes = 8;

// Reads the cluster secret from `path` (trailing whitespace stripped). InvalidArgument naming the
// file and the fix when it cannot be read, is not owned by this user, is readable or writable by
// group or others, is shorter than kMinSecretBytes, or is not random-looking (fewer than
// kMinSecretDistinctBytes distinct bytes).
Status ReadSecretFile(const std::string& path, std::string* secret);
// Another key file with the same checks (e.g. the bearer token of `edl server --http_token_file`),
// errors naming `flag`.
Status ReadTokenFile(const std::string& path, const std::string& flag, std::string* token);
// $HOME/.edl/secret (what scripts/ssh_cluster.sh creates): the default --secret_file.
std::string DefaultSecretFile();

// 32 random bytes from OpenSSL (else /dev/urandom), as 64 lowercase hex characters. Aborts the
// process with a clear message when neither source gives randomness: without it every MAC is
// forgeable.
std::string NewNonce();

// Lowercase hex HMAC-SHA256(secret, message).
std::string HmacHex(const std::string& secret, const std::string& message);

// The two MACs of the handshake, over the whole message (its "mac" field, if any, left out).
std::string HelloMac(const std::string& secret, const std::string& server_nonce,
                     const nlohmann::json& hello);
std::string WelcomeMac(const std::string& secret, const std::string& peer_nonce,
                       const nlohmann::json& welcome);
// Proof on an `error` the server sends after checking a hello's MAC (e.g. a duplicate node
// name): HMAC-SHA256(secret, "edl-server-error:" nonce_p ":" code ":" message). A peer acts on
// an error before the welcome only when this verifies.
std::string ServerErrorMac(const std::string& secret, const std::string& peer_nonce,
                           const std::string& code, const std::string& message);

// Constant-time equality of two MAC strings (false on different lengths).
bool MacEqual(const std::string& a, const std::string& b);

// Seals and checks frames after the handshake (PROTOCOL.md "Sealed frames"). The MAC of the n-th
// frame (n = 0, 1, ...) a side sends is
//   HMAC-SHA256(K, dir || n as u64 big-endian || 12-byte header || payload)
// with dir = 0x01 for server -> peer and 0x02 for peer -> server. The counters are implicit, so
// a dropped, replayed, reordered or reflected frame fails the check.
class SessionMac {
 public:
  static constexpr size_t kTagBytes = 32;
  // `server_side`: this end is the server.
  SessionMac(const std::string& secret, const std::string& server_nonce,
             const std::string& peer_nonce, bool server_side);
  ~SessionMac();
  SessionMac(const SessionMac&) = delete;
  SessionMac& operator=(const SessionMac&) = delete;

  // Writes the MAC of the next frame this side sends into `tag` (kTagBytes).
  void Seal(const char* header, const char* payload, size_t size, char* tag);
  // True when `tag` is the MAC of the next frame expected from the other side; advances the
  // counter only then.
  bool Open(const char* header, const char* payload, size_t size, const char* tag);

 private:
  struct Direction {
    EVP_MAC_CTX* ctx = nullptr;
    unsigned char dir = 0;
    uint64_t seq = 0;
  };
  static void Compute(Direction* d, const char* header, const char* payload, size_t size,
                      unsigned char* out);
  Direction out_, in_;
};

}  // namespace edl::net
