// Frame reader (edl/proto/frame.h): arbitrary bytes as they arrive on a socket. Whatever the bytes,
// DecodeFrame returns a Status; an accepted frame re-encodes to a frame that decodes to the same
// message with the same size.
#include <string>

#include "edl/proto/frame.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edl::proto;
  const std::string buf(reinterpret_cast<const char*>(data), size);
  if (size >= kFrameHeaderBytes) {
    for (bool sealed : {false, true}) {  // before and after the handshake (PROTOCOL.md)
      uint32_t length = 0;
      if (DecodeFrameHeader(buf.data(), kMaxFrameBytes, sealed, &length).ok()) {
        FUZZ_CHECK(length >= 1 && length <= kMaxFrameBytes + (sealed ? kSealTagBytes : 0));
      }
    }
  }
  nlohmann::json payload;
  (void)DecodePayload(buf.data(), buf.size(), &payload);  // any bytes: a Status, never a crash
  nlohmann::json msg;
  size_t consumed = 0;
  if (!DecodeFrame(buf, &msg, &consumed).ok()) return 0;
  FUZZ_CHECK(consumed > kFrameHeaderBytes && consumed <= size);
  FUZZ_CHECK(msg.is_object() && msg.contains("type"));

  const std::string again = EncodeFrame(msg);
  nlohmann::json msg2;
  size_t consumed2 = 0;
  FUZZ_CHECK(DecodeFrame(again, &msg2, &consumed2).ok());
  FUZZ_CHECK(consumed2 == again.size());
  FUZZ_CHECK(EncodeFrame(msg2) == again);
  return 0;
}
