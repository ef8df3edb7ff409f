// Shared-secret authentication for every TCP connection (server <-> client, server <-> ctl).
//
// Handshake (PROTOCOL.md has the frames):
//   server -> peer   challenge{nonce_s}                 32 fresh random bytes per connection
//   peer   -> server hello{role, mac_p, nonce_p, ...}   mac_p = HMAC-SHA256(secret, "edl-peer:" role ":" nonce_s)
//   server -> peer   welcome{mac_s}                     mac_s = HMAC-SHA256(secret, "edl-server:" nonce_p)
// The server accepts nothing but `hello` before the check passes and compares MACs in constant
// time; the peer checks mac_s, so neither side talks to an impostor.
//
// Thread-safety: free functions; reentrant.
#pragma once

#include <string>

#include "edl/base/status.h"

namespace edl::net {

// Reads the cluster secret from `path` (trailing whitespace stripped). InvalidArgument naming the
// file when it cannot be read or the secret is shorter than 16 bytes.
Status ReadSecretFile(const std::string& path, std::string* secret);

// 32 random bytes from OpenSSL, as 64 lowercase hex characters.
std::string NewNonce();

// Lowercase hex HMAC-SHA256(secret, message).
std::string HmacHex(const std::string& secret, const std::string& message);

// The two MACs of the handshake.
std::string PeerMac(const std::string& secret, const std::string& role, const std::string& server_nonce);
std::string ServerMac(const std::string& secret, const std::string& peer_nonce);

// Constant-time equality of two MAC strings (false on different lengths).
bool MacEqual(const std::string& a, const std::string& b);

}  // namespace edl::net
