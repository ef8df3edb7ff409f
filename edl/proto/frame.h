// Wire frames: every message between server, clients, ctl and trainers travels as one frame.
//
//   magic    u32 big-endian  0x45444C31 ("EDL1")
//   version  u16 big-endian  kProtocolVersion
//   reserved u16             must be 0
//   length   u32 big-endian  payload bytes, 1 .. kMaxFrameBytes
//   payload  `length` bytes of UTF-8 JSON: an object with a string field "type"
//
// The same frames run over TCP (server <-> client, server <-> ctl) and over the client's Unix
// socket (client <-> trainers). PROTOCOL.md describes the messages in prose.
//
// Thread-safety: free functions over caller-owned buffers; reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"

namespace edl::proto {

constexpr uint32_t kFrameMagic = 0x45444C31;  // "EDL1"
constexpr uint16_t kProtocolVersion = 1;
constexpr size_t kFrameHeaderBytes = 12;
// The largest payload accepted. Checked on the header, before any payload buffer is allocated.
// A full generation of 8 000 trainers encodes to ~0.5 MiB; deltas are far smaller.
constexpr uint32_t kMaxFrameBytes = 4u << 20;

// Writes the 12-byte header for a payload of `length` bytes into `out`.
void EncodeFrameHeader(uint32_t length, char* out);

// Validates a 12-byte header and returns the payload length. Corruption on a wrong magic, an
// unknown version, a non-zero reserved field, an empty payload or one over `max_bytes`.
Status DecodeFrameHeader(const char* header, uint32_t max_bytes, uint32_t* length);

// Parses a payload: valid JSON, an object, with a non-empty string "type". Never throws.
Status DecodePayload(const char* data, size_t size, nlohmann::json* msg);

// Header + payload of `msg` (which must be an object with a "type"). Never throws: a value that
// cannot be serialised (invalid UTF-8) is replaced by U+FFFD.
std::string EncodeFrame(const nlohmann::json& msg);

// Decodes one whole frame from the front of `buf`. Returns Unavailable ("incomplete") when `buf`
// holds less than a frame; *consumed is set to the frame's size on success.
Status DecodeFrame(const std::string& buf, nlohmann::json* msg, size_t* consumed,
                   uint32_t max_bytes = kMaxFrameBytes);

}  // namespace edl::proto
