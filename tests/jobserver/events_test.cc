// The events-log records: each struct writes the line the log has always held (field names and
// JSON types: scripts, plots, the metrics and many tests read them), and the type names' table.
#include "jobserver/events/events.h"

#include <set>

#include <gtest/gtest.h>

namespace edl::jobserver::events {
namespace {

using nlohmann::json;

template <typename E>
std::string Line(const E& e) {
  const json j = e.ToJson();
  Type t{};
  EXPECT_TRUE(TypeOf(j, &t)) << j.dump();
  EXPECT_EQ(t, E::kType) << j.dump();
  return j.dump();
}

TEST(EventsTest, TypeNamesAreOneTableBothWays) {
  std::set<std::string> names;
  for (size_t i = 0; i < 31; ++i) {
    const Type t = static_cast<Type>(i);
    EXPECT_TRUE(names.insert(NameOf(t)).second) << NameOf(t);
    Type back{};
    ASSERT_TRUE(TypeOf(json{{"type", NameOf(t)}}, &back));
    EXPECT_EQ(back, t);
  }
  Type t{};
  EXPECT_FALSE(TypeOf(json{{"type", "nope"}}, &t));
  EXPECT_FALSE(TypeOf(json{{"type", 3}}, &t));
  EXPECT_FALSE(TypeOf(json::object(), &t));
  EXPECT_FALSE(TypeOf(json::array(), &t));
}

TEST(EventsTest, ServerRecordsKeepTheirLines) {
  EXPECT_EQ(Line(ServerStarted{8180}), R"({"port":8180,"type":"server_started"})");
  EXPECT_EQ(Line(NewJob{"/s", ""}), R"({"state_dir":"/s","state_store":"","type":"new_job"})");
  EXPECT_EQ(Line(NewCluster{"", "etcd://h:1"}),
            R"({"state_dir":"","state_store":"etcd://h:1","type":"new_cluster"})");
  EXPECT_EQ(Line(StateMigrated{"/s"}), R"({"state":"/s","type":"state_migrated"})");
  EXPECT_EQ(Line(ClusterRestored{2, 3, 1}), R"({"ended":1,"jobs":2,"nodes":3,"type":"restored"})");
  EXPECT_EQ(Line(NodeDisconnected{"n1", "IOError: eof"}),
            R"({"node":"n1","type":"node_disconnected","why":"IOError: eof"})");
  EXPECT_EQ(Line(NodeDroppedRejoins{"n1", 2}),
            R"({"node":"n1","stale_trainers":2,"type":"node_dropped_rejoins"})");
  EXPECT_EQ(Line(Stopped{"ctl"}), R"({"by":"ctl","type":"stopped"})");
  EXPECT_EQ(Line(StopComplete{4, 0, FinalCheckpoint::kSaved}),
            R"({"final_checkpoint":"saved","generation":4,"not_left":0,"type":"stop_complete"})");
  EXPECT_EQ(Line(StopComplete{4, 2, FinalCheckpoint::kNotReported}),
            R"({"final_checkpoint":"none","generation":4,"not_left":2,"type":"stop_complete"})");
  EXPECT_EQ((StopComplete{4, 2, FinalCheckpoint::kFailed}.ToJson()["final_checkpoint"]), "failed");
  Progress p;
  p.reporting = 2;
  p.step = 10;
  p.epoch = 1;
  p.loss = 0.5;
  p.images_per_sec = 100;
  p.generation = 3;
  p.world_size = 2;
  EXPECT_EQ(Line(p),
            R"({"accuracy":-1.0,"epoch":1,"generation":3,"images_per_sec":100.0,"loss":0.5,)"
            R"("reporting":2,"step":10,"type":"progress","world_size":2})");
  // A trainer's event: its own fields, the log's time and job dropped, the relay's fields set.
  EXPECT_EQ(
      Line(TrainerEvent{json{{"event", "config"}, {"time", 1}, {"job", "x"}, {"node", "forged"}},
                        "n1-s0-1", "n1"}),
      R"({"event":"config","node":"n1","trainer_id":"n1-s0-1","type":"trainer_event"})");
  JobSpec spec;
  spec.job.name = "a";
  spec.job.type = "t";
  EXPECT_EQ(Submitted{spec}.ToJson(), (json{{"type", "submitted"}, {"spec", EncodeJobSpec(spec)}}));
}

TEST(EventsTest, ClusterRecordsKeepTheirLines) {
  EXPECT_EQ(Line(NodeJoined{"n1", "10.0.0.1", 2, proto::NodeMode::kRestart, {"a", "b"}}),
            R"({"host":"10.0.0.1","job_types":["a","b"],"mode":"restart","node":"n1","slots":2,)"
            R"("type":"node_joined"})");
  EXPECT_EQ(
      Line(NodeJoined{"n1", "h", 1, proto::NodeMode::kInplace, {}}),
      R"({"host":"h","job_types":[],"mode":"inplace","node":"n1","slots":1,"type":"node_joined"})");
  EXPECT_EQ(Line(StaleTrainers{"n1", {"n1-s0-1"}, std::nullopt}),
            R"({"node":"n1","trainer_ids":["n1-s0-1"],"type":"stale_trainers"})");
  EXPECT_EQ(Line(StaleTrainers{"n1", {"n1-s0-1"}, 5}),
            R"({"generation":5,"node":"n1","trainer_ids":["n1-s0-1"],"type":"stale_trainers"})");
  PolicyEvent pe;
  pe.time_us = 7;
  pe.kind = "node_added";
  pe.node = "n1";
  EXPECT_EQ(Line(Policy{pe}),
            R"({"event":"node_added","node":"n1","reason":"","time_us":7,"type":"policy"})");
  EXPECT_EQ(Line(Failing{3, "exit 1", "boom"}),
            R"({"exits":3,"how":"exit 1","last_error":"boom","type":"failing"})");
  EXPECT_EQ(Line(JobFinished{"a"}), R"({"job_name":"a","type":"job_finished"})");
  EXPECT_EQ(Line(JobCancelled{"a"}), R"({"job_name":"a","type":"job_cancelled"})");
}

TEST(EventsTest, MembershipRecordsKeepTheirLines) {
  EXPECT_EQ(Line(NodeLost{"n1", "silent"}), R"({"node":"n1","type":"node_lost","why":"silent"})");
  EXPECT_EQ(Line(MembersLostWithNode{"n2", {"a", "b"}, 7, "c"}),
            R"({"generation":7,"node":"n2","reporter":"c","trainer_ids":["a","b"],)"
            R"("type":"members_lost_with_node"})");
  EXPECT_EQ(Line(Desired{4, "ctl"}), R"({"desired":4,"reason":"ctl","type":"desired"})");
  EXPECT_EQ(Line(Kill{{"a", "b"}}), R"({"trainers":["a","b"],"type":"kill"})");
  EXPECT_EQ(Line(Kill{}), R"({"trainers":[],"type":"kill"})");
  EXPECT_EQ(Line(Stop{"ctl", 3, 2}), R"({"by":"ctl","generation":3,"trainers":2,"type":"stop"})");
  EXPECT_EQ(Line(Prepare{3, "script", 2}),
            R"({"generation":3,"joiners":2,"reason":"script","type":"prepare"})");
  EXPECT_EQ(Line(PrepareAborted{3, "late"}),
            R"({"generation":3,"type":"prepare_aborted","why":"late"})");
  EXPECT_EQ(
      Line(Generation{3, "script", false, 2, 4, 0}),
      R"({"failure":false,"generation":3,"prepare_s":0.0,"reason":"script","type":"generation",)"
      R"("world_size_after":4,"world_size_before":2})");
  EXPECT_EQ(Line(TrainerExit{"a", "exit 0", true}),
            R"({"how":"exit 0","success":true,"trainer_id":"a","type":"trainer_exit"})");
  EXPECT_EQ(Line(JoinerExit{"a", "signal 9"}),
            R"({"how":"signal 9","trainer_id":"a","type":"joiner_exit"})");
  EXPECT_EQ(Line(JoinerRefused{"a", "n1", "config"}),
            R"({"node":"n1","trainer_id":"a","type":"joiner_refused","why":"config"})");
  EXPECT_EQ(Line(FailedWhileFinishing{"a", "exit 1"}),
            R"({"how":"exit 1","trainer_id":"a","type":"failed_while_finishing"})");
  EXPECT_EQ(Line(Finished{5, 2}), R"({"generation":5,"type":"finished","world_size":2})");
  EXPECT_EQ(Line(JobRestored{5, 2, 9, 3, false}),
            R"({"done":false,"generation":5,"max_generation":9,"nodes":3,"type":"restored",)"
            R"("world_size":2})");
  EXPECT_EQ(Line(Recovered{5, 2}), R"({"generation":5,"type":"recovered","world_size":2})");
}

}  // namespace
}  // namespace edl::jobserver::events
