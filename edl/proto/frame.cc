#include "edl/proto/frame.h"

#include <cstdio>

namespace edl::proto {
namespace {

void PutU32(uint32_t v, char* p) {
  p[0] = static_cast<char>(v >> 24);
  p[1] = static_cast<char>(v >> 16);
  p[2] = static_cast<char>(v >> 8);
  p[3] = static_cast<char>(v);
}
uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}
uint16_t GetU16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>((u[0] << 8) | u[1]);
}

bool IsTypeChar(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }

}  // namespace

void EncodeFrameHeader(uint32_t length, char* out, uint16_t flags) {
  PutU32(kFrameMagic, out);
  out[4] = static_cast<char>(kProtocolVersion >> 8);
  out[5] = static_cast<char>(kProtocolVersion & 0xff);
  out[6] = static_cast<char>(flags >> 8);
  out[7] = static_cast<char>(flags & 0xff);
  PutU32(length, out + 8);
}

Status DecodeFrameHeader(const char* header, uint32_t max_payload_bytes, bool expect_sealed,
                         uint32_t* length) {
  const uint32_t magic = GetU32(header);
  if (magic != kFrameMagic) {
    char buf[16];
    snprintf(buf, sizeof(buf), "%08x", magic);
    return Status::Corruption(std::string("bad frame magic 0x") + buf +
                              " (expected EDL1): the peer does not speak the EDL protocol "
                              "(wrong port?)");
  }
  const uint16_t version = GetU16(header + 4);
  if (version != kProtocolVersion) {
    return Status::Corruption("frame protocol version " + std::to_string(version) +
                              ", this build speaks " + std::to_string(kProtocolVersion) +
                              ": run the same edl version on every node");
  }
  const uint16_t flags = GetU16(header + 6);
  if ((flags & ~kFrameSealed) != 0) return Status::Corruption("frame has unknown flags");
  const bool sealed = (flags & kFrameSealed) != 0;
  if (sealed != expect_sealed) {
    return Status::Corruption(expect_sealed ? "unsealed frame after the handshake (injected?)"
                                            : "sealed frame before the handshake finished");
  }
  const uint32_t len = GetU32(header + 8);
  const uint32_t tag = sealed ? kSealTagBytes : 0;
  if (len <= tag) return Status::Corruption("empty frame payload");
  if (len - tag > max_payload_bytes) {
    return Status::Corruption("frame of " + std::to_string(len - tag) +
                              " bytes exceeds the limit of " + std::to_string(max_payload_bytes) +
                              " bytes");
  }
  *length = len;
  return Status::OK();
}

Status CheckJsonDepth(const char* data, size_t size, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < size; ++i) {
    const char c = data[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return Status::Corruption("frame payload nests deeper than " + std::to_string(max_depth) +
                                  " levels");
      }
    } else if (c == ']' || c == '}') {
      --depth;  // imbalance is the parser's to report
    }
  }
  return Status::OK();
}

Status DecodePayload(const char* data, size_t size, nlohmann::json* msg) {
  EDL_RETURN_IF_ERROR(CheckJsonDepth(data, size));
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Status::Corruption("frame payload is not valid JSON: " +
                              Quote(std::string_view(data, size)));
  }
  if (!j.is_object()) return Status::Corruption("frame payload is not a JSON object");
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) {
    return Status::Corruption("frame payload has no string field \"type\"");
  }
  const auto& type = it->get_ref<const std::string&>();
  bool good = !type.empty() && type.size() <= kMaxTypeBytes;
  for (char c : type) good = good && IsTypeChar(c);
  if (!good) {
    return Status::Corruption("frame payload's \"type\" " + Quote(type) + " is not 1.." +
                              std::to_string(kMaxTypeBytes) + " lowercase letters or '_'");
  }
  *msg = std::move(j);
  return Status::OK();
}

const std::string& TypeOf(const nlohmann::json& msg) {
  static const std::string kNone;
  if (!msg.is_object()) return kNone;
  const auto it = msg.find("type");
  return it != msg.end() && it->is_string() ? it->get_ref<const std::string&>() : kNone;
}

std::string EncodeFrame(const nlohmann::json& msg) {
  std::string out(kFrameHeaderBytes, '\0');
  out += msg.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  EncodeFrameHeader(static_cast<uint32_t>(out.size() - kFrameHeaderBytes), out.data());
  return out;
}

Status DecodeFrame(const std::string& buf, nlohmann::json* msg, size_t* consumed,
                   uint32_t max_bytes) {
  if (buf.size() < kFrameHeaderBytes) return Status::Unavailable("incomplete frame header");
  uint32_t len = 0;
  EDL_RETURN_IF_ERROR(DecodeFrameHeader(buf.data(), max_bytes, /*expect_sealed=*/false, &len));
  if (buf.size() - kFrameHeaderBytes < len) return Status::Unavailable("incomplete frame payload");
  EDL_RETURN_IF_ERROR(DecodePayload(buf.data() + kFrameHeaderBytes, len, msg));
  *consumed = kFrameHeaderBytes + len;
  return Status::OK();
}

namespace {

// Appends the escaped prefix of `s` to `out`; returns how many bytes of `s` were cut.
// Printable ASCII as it is but for a backslash (\\) and, when `quoted`, a single quote (\');
// everything else as \xNN.
size_t AppendEscaped(std::string_view s, size_t max_chars, bool quoted, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  size_t used = 0;
  size_t i = 0;
  for (; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const bool backslashed = c == '\\' || (quoted && c == '\'');
    const bool plain = c >= 0x20 && c < 0x7f && !backslashed;
    const size_t cost = plain ? 1 : backslashed ? 2 : 4;
    if (used + cost > max_chars) break;
    used += cost;
    if (plain) {
      *out += static_cast<char>(c);
    } else if (backslashed) {
      *out += '\\';
      *out += static_cast<char>(c);
    } else {
      *out += "\\x";
      *out += kHex[c >> 4];
      *out += kHex[c & 15];
    }
  }
  return s.size() - i;
}

std::string CutNote(size_t cut) {
  return cut == 0 ? "" : "...(+" + std::to_string(cut) + " bytes)";
}

}  // namespace

std::string Quote(std::string_view s, size_t max_chars) {
  std::string out = "'";
  const size_t cut = AppendEscaped(s, max_chars, /*quoted=*/true, &out);
  return out + "'" + CutNote(cut);
}

std::string Escape(std::string_view s, size_t max_chars) {
  std::string out;
  const size_t cut = AppendEscaped(s, max_chars, /*quoted=*/false, &out);
  return out + CutNote(cut);
}

std::string QuoteJson(const nlohmann::json& j, size_t max_chars) {
  return Quote(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), max_chars);
}

}  // namespace edl::proto
