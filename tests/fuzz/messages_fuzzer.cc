// Message decoders (edl/proto/messages.h, service_messages.h): a frame payload goes through
// DecodePayload, then through every message's DecodeFrom (DecodeFrom does not look at "type", so
// each decoder sees every input). A message a decoder accepts must encode to JSON that decodes
// again to the same encoding, and an accepted GenerationUpdate is applied to a small current
// generation, as a client does.
#include <string>

#include "edl/proto/frame.h"
#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using nlohmann::json;

template <typename M>
void RoundTrip(const json& j) {
  M m;
  if (!m.DecodeFrom(j).ok()) return;
  json enc;
  m.EncodeTo(&enc);
  M m2;
  FUZZ_CHECK(m2.DecodeFrom(enc).ok());
  json enc2;
  m2.EncodeTo(&enc2);
  FUZZ_CHECK(enc == enc2);
  (void)m2.DebugString();
}

void ApplyUpdate(const json& j) {
  edl::proto::GenerationUpdate u;
  if (!u.DecodeFrom(j).ok()) return;
  edl::proto::GenerationInfo current;
  current.generation = 1;
  current.job_id = "job";
  current.reason = "start";
  current.members = {{"a-s0-1", "a", 0, 0, "127.0.0.1"}, {"b-s0-2", "b", 0, 1, "127.0.0.1"}};
  edl::proto::GenerationInfo next = current;
  if (!u.ApplyTo(&next).ok()) return;
  for (size_t i = 0; i < next.members.size(); ++i) {
    FUZZ_CHECK(next.members[i].rank == static_cast<int>(i));
  }
  // The sender's side: the delta between the two must rebuild `next` from `current`.
  edl::proto::GenerationInfo rebuilt = current;
  FUZZ_CHECK(edl::proto::GenerationUpdate::Between(current, next).ApplyTo(&rebuilt).ok());
  FUZZ_CHECK(rebuilt.members == next.members);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edl::proto;
  json j;
  if (!DecodePayload(reinterpret_cast<const char*>(data), size, &j).ok()) return 0;
  RoundTrip<GenerationInfo>(j);
  RoundTrip<GenerationUpdate>(j);
  RoundTrip<Challenge>(j);
  RoundTrip<Hello>(j);
  RoundTrip<Welcome>(j);
  RoundTrip<ErrorMsg>(j);
  RoundTrip<TrainerHello>(j);
  RoundTrip<Prepare>(j);
  RoundTrip<Kill>(j);
  RoundTrip<TrainerExit>(j);
  RoundTrip<Ready>(j);
  RoundTrip<Progress>(j);
  RoundTrip<Event>(j);
  RoundTrip<KvRequest>(j);
  RoundTrip<KvReply>(j);
  RoundTrip<CtlRequest>(j);
  RoundTrip<CtlReply>(j);
  RoundTrip<ServiceStats>(j);
  RoundTrip<ServiceMembers>(j);
  RoundTrip<TeacherRequest>(j);
  RoundTrip<TeacherReply>(j);
  RoundTrip<TeacherCancel>(j);
  RoundTrip<ServiceWatch>(j);
  RoundTrip<TeacherOrder>(j);
  ApplyUpdate(j);
  return 0;
}
