#include "edl/proto/frames.h"

#include <string>

namespace edl::proto {

using nlohmann::json;

namespace {

// Decodes `j` as a T into *out; on a refusal *out holds a default T.
template <typename T, typename Variant>
Status DecodeAs(const json& j, Variant* out) {
  T m;
  Status s = m.DecodeFrom(j);
  *out = s.ok() ? std::move(m) : T();
  return s;
}

// The frame's type, or Corruption (the frame layer already refuses a frame without one).
Status TypeOf(const json& j, std::string* type) {
  const auto t = j.is_object() ? j.find("type") : j.end();
  if (!j.is_object() || t == j.end() || !t->is_string()) {
    return Status::Corruption("frame payload has no string field \"type\"");
  }
  *type = t->get<std::string>();
  return Status::OK();
}

}  // namespace

Status DecodeClientFrame(const json& j, ClientFrame* out) {
  std::string type;
  EDL_RETURN_IF_ERROR(TypeOf(j, &type));
  if (type == msg::kHeartbeat) return DecodeAs<Heartbeat>(j, out);
  if (type == msg::kTrainerExit) return DecodeAs<TrainerExit>(j, out);
  if (type == msg::kReady) return DecodeAs<Ready>(j, out);
  if (type == msg::kProgress) return DecodeAs<Progress>(j, out);
  if (type == msg::kEvent) return DecodeAs<Event>(j, out);
  if (type == msg::kKv) return DecodeAs<KvRequest>(j, out);
  if (type == msg::kNodeStats) return DecodeAs<NodeStats>(j, out);
  if (type == msg::kServiceWatch) return DecodeAs<ServiceWatch>(j, out);
  if (type == msg::kTeacherExit) return DecodeAs<TeacherOrder>(j, out);
  return Status::InvalidArgument("unexpected message '" + type + "' from a client");
}

Status DecodeTrainerFrame(const json& j, TrainerFrame* out) {
  std::string type;
  EDL_RETURN_IF_ERROR(TypeOf(j, &type));
  if (type == msg::kHeartbeat) return DecodeAs<Heartbeat>(j, out);
  if (type == msg::kReady) return DecodeAs<Ready>(j, out);
  if (type == msg::kProgress) return DecodeAs<Progress>(j, out);
  if (type == msg::kEvent) return DecodeAs<Event>(j, out);
  if (type == msg::kKv) return DecodeAs<KvRequest>(j, out);
  if (type == msg::kServiceWatch) return DecodeAs<ServiceWatch>(j, out);
  return Status::InvalidArgument("unexpected message '" + type + "' from a trainer");
}

Status DecodeServerFrame(const json& j, ServerFrame* out) {
  std::string type;
  EDL_RETURN_IF_ERROR(TypeOf(j, &type));
  if (type == msg::kHeartbeat) return DecodeAs<Heartbeat>(j, out);
  if (type == msg::kGeneration) return DecodeAs<GenerationUpdate>(j, out);
  if (type == msg::kPrepare) return DecodeAs<Prepare>(j, out);
  if (type == msg::kKill) return DecodeAs<Kill>(j, out);
  if (type == msg::kJobInfo) return DecodeAs<JobInfo>(j, out);
  if (type == msg::kKvReply) return DecodeAs<KvReply>(j, out);
  if (type == msg::kTeacherStart || type == msg::kTeacherStop)
    return DecodeAs<TeacherOrder>(j, out);
  if (type == msg::kServiceMembers) return DecodeAs<ServiceMembers>(j, out);
  if (type == msg::kStop) return DecodeAs<Stop>(j, out);
  if (type == msg::kDone) return DecodeAs<Done>(j, out);
  if (type == msg::kError) return DecodeAs<ErrorMsg>(j, out);
  return Status::InvalidArgument("unexpected message '" + type + "' from the server");
}

}  // namespace edl::proto
