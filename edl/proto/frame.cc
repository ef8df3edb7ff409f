#include "edl/proto/frame.h"

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

}  // namespace

void EncodeFrameHeader(uint32_t length, char* out) {
  PutU32(kFrameMagic, out);
  out[4] = static_cast<char>(kProtocolVersion >> 8);
  out[5] = static_cast<char>(kProtocolVersion & 0xff);
  out[6] = 0;
  out[7] = 0;
  PutU32(length, out + 8);
}

Status DecodeFrameHeader(const char* header, uint32_t max_bytes, uint32_t* length) {
  const uint32_t magic = GetU32(header);
  if (magic != kFrameMagic) {
    return Status::Corruption("bad frame magic 0x" + [&] {
      char buf[16];
      snprintf(buf, sizeof(buf), "%08x", magic);
      return std::string(buf);
    }() + " (expected EDL1): the peer does not speak the EDL protocol (wrong port?)");
  }
  const uint16_t version = GetU16(header + 4);
  if (version != kProtocolVersion) {
    return Status::Corruption("frame protocol version " + std::to_string(version) +
                              ", this build speaks " + std::to_string(kProtocolVersion) +
                              ": run the same edl version on every node");
  }
  if (GetU16(header + 6) != 0) return Status::Corruption("frame reserved field is not zero");
  const uint32_t len = GetU32(header + 8);
  if (len == 0) return Status::Corruption("empty frame payload");
  if (len > max_bytes) {
    return Status::Corruption("frame of " + std::to_string(len) + " bytes exceeds the limit of " +
                              std::to_string(max_bytes) + " bytes");
  }
  *length = len;
  return Status::OK();
}

Status DecodePayload(const char* data, size_t size, nlohmann::json* msg) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Corruption("frame payload is not valid JSON");
  if (!j.is_object()) return Status::Corruption("frame payload is not a JSON object");
  auto it = j.find("type");
  if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
    return Status::Corruption("frame payload has no string field \"type\"");
  }
  *msg = std::move(j);
  return Status::OK();
}

std::string EncodeFrame(const nlohmann::json& msg) {
  const std::string payload = msg.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(static_cast<uint32_t>(payload.size()), out.data());
  out += payload;
  return out;
}

Status DecodeFrame(const std::string& buf, nlohmann::json* msg, size_t* consumed,
                   uint32_t max_bytes) {
  if (buf.size() < kFrameHeaderBytes) return Status::Unavailable("incomplete frame header");
  uint32_t len = 0;
  EDL_RETURN_IF_ERROR(DecodeFrameHeader(buf.data(), max_bytes, &len));
  if (buf.size() - kFrameHeaderBytes < len) return Status::Unavailable("incomplete frame payload");
  EDL_RETURN_IF_ERROR(DecodePayload(buf.data() + kFrameHeaderBytes, len, msg));
  *consumed = kFrameHeaderBytes + len;
  return Status::OK();
}

}  // namespace edl::proto
