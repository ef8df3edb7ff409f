// Checkpoint metadata (edl/ckpt/checkpoint_store.h): the JSON record read back from a store that
// may be corrupt or written by another version. DecodeJson returns a Status whatever the bytes; an
// accepted record encodes to JSON that decodes to the same encoding.
#include <string>

#include "edl/ckpt/checkpoint_store.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using edl::ckpt::CheckpointMeta;
  CheckpointMeta meta;
  if (!CheckpointMeta::DecodeJson(std::string(reinterpret_cast<const char*>(data), size), &meta)
           .ok()) {
    return 0;
  }
  uint64_t sum = 0;
  for (const auto& t : meta.tensors) {
    FUZZ_CHECK(meta.FindTensor(t.name) != nullptr);
    sum += t.bytes;
  }
  FUZZ_CHECK(meta.TotalBytes() == sum);
  const std::string enc = meta.EncodeJson();
  CheckpointMeta again;
  FUZZ_CHECK(CheckpointMeta::DecodeJson(enc, &again).ok());
  FUZZ_CHECK(again.EncodeJson() == enc);
  return 0;
}
