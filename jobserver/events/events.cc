#include "jobserver/events/events.h"

#include "edl/proto/frame.h"

namespace edl::jobserver::events {

using nlohmann::json;

bool TypeOf(const json& record, Type* out) {
  const std::string& type = proto::TypeOf(record);
  return !type.empty() && kTypeNames.Parse(type, out);
}

// ---- the server's

json ServerStarted::ToJson() const { return {{"type", NameOf(kType)}, {"port", port}}; }

json StateMigrated::ToJson() const { return {{"type", NameOf(kType)}, {"state", state}}; }

json ClusterRestored::ToJson() const {
  return {{"type", NameOf(kType)}, {"jobs", jobs}, {"nodes", nodes}, {"ended", ended}};
}

json NodeDisconnected::ToJson() const {
  return {{"type", NameOf(kType)}, {"node", node}, {"why", why}};
}

json NodeDroppedRejoins::ToJson() const {
  return {{"type", NameOf(kType)}, {"node", node}, {"stale_trainers", stale_trainers}};
}

json Stopped::ToJson() const { return {{"type", NameOf(kType)}, {"by", by}}; }

json StopComplete::ToJson() const {
  return {{"type", NameOf(kType)},
          {"generation", generation},
          {"not_left", not_left},
          {"final_checkpoint", kFinalCheckpointNames.Name(final_checkpoint)}};
}

json Submitted::ToJson() const { return {{"type", NameOf(kType)}, {"spec", EncodeJobSpec(spec)}}; }

json Progress::ToJson() const {
  json j = {{"type", NameOf(kType)},
            {"reporting", reporting},
            {"step", step},
            {"epoch", epoch},
            {"loss", loss},
            {"images_per_sec", images_per_sec},
            {"accuracy", accuracy},
            {"generation", generation},
            {"world_size", world_size}};
  if (samples >= 0) j["samples"] = samples;  // reported by the trainers (not by older ones)
  return j;
}

json TrainerEvent::ToJson() const {
  json rec = event.is_object() ? event : json::object();
  rec["type"] = NameOf(kType);
  rec["trainer_id"] = trainer_id;
  rec["node"] = node;
  rec.erase("time");  // the log's own fields (EventsLog::Append)
  rec.erase("job");
  return rec;
}

// ---- the cluster's

json NodeJoined::ToJson() const {
  return {{"type", NameOf(kType)},       {"node", node},          {"host", host}, {"slots", slots},
          {"mode", proto::NameOf(mode)}, {"job_types", job_types}};
}

json StaleTrainers::ToJson() const {
  json j = {{"type", NameOf(kType)}, {"node", node}, {"trainer_ids", trainer_ids}};
  if (generation) j["generation"] = *generation;
  return j;
}

json Policy::ToJson() const {
  json j = event.ToJson();
  j["type"] = NameOf(kType);
  return j;
}

json Failing::ToJson() const {
  return {{"type", NameOf(kType)}, {"exits", exits}, {"how", how}, {"last_error", last_error}};
}

// ---- a job's membership

json NodeLost::ToJson() const { return {{"type", NameOf(kType)}, {"node", node}, {"why", why}}; }

json Desired::ToJson() const {
  return {{"type", NameOf(kType)}, {"desired", desired}, {"reason", reason}};
}

json Kill::ToJson() const { return {{"type", NameOf(kType)}, {"trainers", trainers}}; }

json Stop::ToJson() const {
  return {{"type", NameOf(kType)}, {"by", by}, {"generation", generation}, {"trainers", trainers}};
}

json Prepare::ToJson() const {
  return {{"type", NameOf(kType)},
          {"generation", generation},
          {"reason", reason},
          {"joiners", joiners}};
}

json PrepareAborted::ToJson() const {
  return {{"type", NameOf(kType)}, {"generation", generation}, {"why", why}};
}

json Generation::ToJson() const {
  return {{"type", NameOf(kType)},
          {"generation", generation},
          {"reason", reason},
          {"failure", failure},
          {"world_size_before", world_size_before},
          {"world_size_after", world_size_after},
          {"prepare_s", prepare_s}};
}

json TrainerExit::ToJson() const {
  return {{"type", NameOf(kType)}, {"trainer_id", trainer_id}, {"how", how}, {"success", success}};
}

json JoinerExit::ToJson() const {
  return {{"type", NameOf(kType)}, {"trainer_id", trainer_id}, {"how", how}};
}

json JoinerRefused::ToJson() const {
  return {{"type", NameOf(kType)}, {"trainer_id", trainer_id}, {"node", node}, {"why", why}};
}

json MembersLostWithNode::ToJson() const {
  return {{"type", NameOf(kType)},
          {"node", node},
          {"trainer_ids", trainer_ids},
          {"generation", generation},
          {"reporter", reporter}};
}

json FailedWhileFinishing::ToJson() const {
  return {{"type", NameOf(kType)}, {"trainer_id", trainer_id}, {"how", how}};
}

json Finished::ToJson() const {
  return {{"type", NameOf(kType)}, {"generation", generation}, {"world_size", world_size}};
}

json JobRestored::ToJson() const {
  return {{"type", NameOf(kType)},    {"generation", generation},
          {"world_size", world_size}, {"max_generation", max_generation},
          {"nodes", nodes},           {"done", done}};
}

json Recovered::ToJson() const {
  return {{"type", NameOf(kType)}, {"generation", generation}, {"world_size", world_size}};
}

}  // namespace edl::jobserver::events
