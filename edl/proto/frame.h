// Wire frames: every message between server, clients, ctl and trainers travels as one frame.
//
//   magic    u32 big-endian  0x45444C31 ("EDL1")
//   version  u16 big-endian  kProtocolVersion
//   flags    u16 big-endian  kFrameSealed or 0; every other bit must be 0
//   length   u32 big-endian  bytes that follow the header: the payload, plus the 32-byte session
//                            MAC when sealed (edl/net/auth.h SessionMac)
//   payload  UTF-8 JSON: an object with a short string field "type"
//
// The same frames run over TCP (server <-> client, server <-> ctl) and over the client's Unix
// socket (client <-> trainers). On TCP every frame after the handshake is sealed; PROTOCOL.md
// describes the messages, the handshake and the sealing in prose.
//
// Every byte here comes from a peer that may be hostile: the header is checked before anything
// is allocated, the payload's nesting is bounded by a linear pre-scan before the JSON parser sees
// it, and error texts quote at most a short escaped prefix of what the peer sent.
//
// Thread-safety: free functions over caller-owned buffers; reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"

namespace edl::proto {

constexpr uint32_t kFrameMagic = 0x45444C31;  // "EDL1"
// 2: the reserved field became `flags` and post-handshake frames carry a session MAC.
constexpr uint16_t kProtocolVersion = 2;
constexpr size_t kFrameHeaderBytes = 12;
constexpr uint16_t kFrameSealed = 1;  // flags bit: the payload is followed by a session MAC
constexpr size_t kSealTagBytes = 32;  // HMAC-SHA256
// The largest payload accepted after authentication. A full generation of 8 000 trainers encodes
// to ~0.5 MiB; deltas are far smaller.
constexpr uint32_t kMaxFrameBytes = 4u << 20;
// The largest payload accepted before the peer has authenticated (challenge, hello, welcome,
// error): a hello of a node with a few hundred slots is a few KiB.
constexpr uint32_t kMaxPreAuthFrameBytes = 64u << 10;
// Deepest nesting of arrays / objects accepted in a payload (real messages nest 4 levels).
constexpr int kMaxJsonDepth = 32;
// Longest "type" value; types are lowercase letters and '_'.
constexpr size_t kMaxTypeBytes = 32;

// Writes the 12-byte header for `length` bytes after it into `out`.
void EncodeFrameHeader(uint32_t length, char* out, uint16_t flags = 0);

// Validates a 12-byte header and returns the number of bytes that follow it (payload, plus the
// MAC when sealed). Corruption on a wrong magic, an unknown version, unknown flags, a sealed flag
// that differs from `expect_sealed`, an empty payload or a payload over `max_payload_bytes`.
Status DecodeFrameHeader(const char* header, uint32_t max_payload_bytes, bool expect_sealed,
                         uint32_t* length);

// Linear, non-recursive scan of a JSON text: Corruption when arrays / objects nest deeper than
// `max_depth` (strings and escapes are skipped correctly). Run before any JSON parser.
Status CheckJsonDepth(const char* data, size_t size, int max_depth = kMaxJsonDepth);

// Parses a payload: depth-checked, valid JSON, an object, with a "type" of 1..kMaxTypeBytes
// lowercase letters / '_'. Never throws; errors quote at most a short prefix of the payload.
Status DecodePayload(const char* data, size_t size, nlohmann::json* msg);

// The "type" of `msg`: what DecodePayload checked; "" for a value without a string "type" (a
// message this process built wrong). Never throws.
const std::string& TypeOf(const nlohmann::json& msg);

// Header + payload of `msg` (which must be an object with a "type"), unsealed. Never throws: a
// value that cannot be serialised (invalid UTF-8) is replaced by U+FFFD.
std::string EncodeFrame(const nlohmann::json& msg);

// Decodes one whole unsealed frame from the front of `buf`. Returns Unavailable ("incomplete")
// when `buf` holds less than a frame; *consumed is set to the frame's size on success.
Status DecodeFrame(const std::string& buf, nlohmann::json* msg, size_t* consumed,
                   uint32_t max_bytes = kMaxFrameBytes);

// For errors and logs: at most `max_chars` characters of `s` in single quotes, printable ASCII
// kept but for '\\' and '\'' (backslashed: \\ and \'), everything else as \xNN, with
// "...(+N bytes)" when cut. Safe to print whatever `s` holds.
std::string Quote(std::string_view s, size_t max_chars = 64);
// Quote() without the quotes (a single quote stays as it is), for text that is shown as it is (an
// error message from a peer).
std::string Escape(std::string_view s, size_t max_chars = 64);
// Quote() of a JSON value's compact text (values reaching here passed CheckJsonDepth, so the
// serialiser's recursion is bounded).
std::string QuoteJson(const nlohmann::json& j, size_t max_chars = 64);

}  // namespace edl::proto
