// ServerMetrics (jobserver/http/metrics.h) and the request-head parser
// (jobserver/http/http_request.h), without sockets: what a status body and a stream of events-log
// records become in Prometheus text (checked by Debian's promtool where installed), the bounds on
// what records can make it hold, the dashboard's ring, and what the parser accepts and refuses.
#include "jobserver/http/metrics.h"

#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "jobserver/http/http_request.h"
#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using nlohmann::json;

bool Has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

json SingleStatus() {
  return {
      {"job_id", "j1"},
      {"generation", 3},
      {"world_size", 4},
      {"desired", 4},
      {"pending", false},
      {"done", false},
      {"total_slots", 8},
      {"used_slots", 4},
      {"progress",
       {{"reporting", 4},
        {"step", 120},
        {"epoch", 1},
        {"loss", 0.5},
        {"images_per_sec", 800.5},
        {"measured",
         {{"noise_steps", 30},
          {"grad_sqr", 0.5},
          {"grad_var", 64.0},
          {"noise_scale", 128.0},
          {"compute_s_per_sample", 0.004}}}}},
      {"nodes", json::array({{{"name", "n1"}, {"slots", 4}, {"used", 2}, {"connected", true}},
                             {{"name", "n\"2"}, {"slots", 4}, {"used", 2}, {"connected", false}}})},
      {"services",
       {{"teach",
         {{"students", 2},
          {"desired", 3},
          {"teachers", json::array({{{"requests_per_sec", 10}, {"latency_ms", 20}},
                                    {{"requests_per_sec", 30}, {"latency_ms", 40}}})},
          {"placed", json::array({{{"stopping", false}}, {{"stopping", true}}})},
          {"restarts", 1}}}}}};
}

TEST(MetricsTest, RendersTheStatusOfASingleJobServer) {
  ManualClock clock;
  ServerMetrics m(&clock);
  m.ConnectionOpened();
  m.ConnectionOpened();
  m.ConnectionClosed();
  m.FrameRefused(FrameRefusal::kNotPlaced);
  m.NodeHeard("n1");
  clock.Advance(2'500'000);
  const std::string t = m.Render(SingleStatus());
  EXPECT_TRUE(Has(t, "edl_job_trainers{job_name=\"j1\"} 4")) << t;
  EXPECT_TRUE(Has(t, "edl_job_desired_trainers{job_name=\"j1\"} 4")) << t;
  EXPECT_TRUE(Has(t, "edl_job_generation{job_name=\"j1\"} 3")) << t;
  EXPECT_TRUE(Has(t, "edl_job_images_per_second{job_name=\"j1\"} 800.5")) << t;
  EXPECT_TRUE(Has(t, "edl_job_loss{job_name=\"j1\"} 0.5")) << t;
  EXPECT_TRUE(Has(t, "edl_job_gradient_noise_scale{job_name=\"j1\"} 128")) << t;
  EXPECT_TRUE(Has(t, "edl_job_compute_seconds_per_sample{job_name=\"j1\"} 0.004")) << t;
  EXPECT_EQ(t.find("edl_job_allreduce_seconds{"), std::string::npos) << "not measured: " << t;
  EXPECT_TRUE(Has(t, "edl_job_state{job_name=\"j1\",state=\"running\"} 1")) << t;
  EXPECT_TRUE(Has(t, "edl_job_state{job_name=\"j1\",state=\"pending\"} 0")) << t;
  EXPECT_TRUE(Has(t, "edl_node_slots{node=\"n1\"} 4")) << t;
  EXPECT_TRUE(Has(t, "edl_node_connected{node=\"n\\\"2\"} 0")) << "label values escaped: " << t;
  EXPECT_TRUE(Has(t, "edl_node_heartbeat_age_seconds{node=\"n1\"} 2.5")) << t;
  EXPECT_TRUE(Has(t, "edl_service_desired_teachers{service=\"teach\"} 3")) << t;
  EXPECT_TRUE(Has(t, "edl_service_placed_teachers{service=\"teach\"} 1"))
      << "not the stopping one: " << t;
  EXPECT_TRUE(Has(t, "edl_service_requests_per_second{service=\"teach\"} 40")) << t;
  EXPECT_TRUE(Has(t, "edl_service_latency_seconds{service=\"teach\"} 0.035"))
      << "request-weighted: " << t;
  EXPECT_TRUE(Has(t, "edl_server_connections 1")) << t;
  EXPECT_TRUE(Has(t, "edl_server_connections_accepted_total 2")) << t;
  EXPECT_TRUE(Has(t, "edl_server_frames_refused_total{reason=\"not_placed\"} 1")) << t;
  EXPECT_TRUE(Has(t, "edl_server_uptime_seconds 2.5")) << t;
  EXPECT_TRUE(Has(t, "# TYPE edl_job_generations_total counter")) << t;
}

TEST(MetricsTest, CountsRecordsAndKeepsTheTimeline) {
  ManualClock clock;
  ServerMetrics m(&clock);
  auto rec = [&](json r) {
    r["job"] = "j1";
    r["time"] = 100.0;
    m.OnRecord(r);
    // Trainer events reach the metrics typed, as the server decoded them at the edge.
    if (r["type"] == "trainer_event") m.TrainerEvent("j1", proto::DecodeTrainerEvent(r));
  };
  rec({{"type", "generation"},
       {"generation", 1},
       {"reason", "start"},
       {"world_size_before", 0},
       {"world_size_after", 4}});
  rec({{"type", "progress"},
       {"generation", 1},
       {"world_size", 4},
       {"images_per_sec", 100},
       {"loss", 2.0}});
  rec({{"type", "trainer_exit"}, {"trainer_id", "t1"}, {"how", "signal 9"}, {"success", false}});
  rec({{"type", "trainer_exit"}, {"trainer_id", "t2"}, {"how", "exit 0"}, {"success", true}});
  rec({{"type", "generation"},
       {"generation", 2},
       {"reason", "failure"},
       {"failure", true},
       {"world_size_before", 4},
       {"world_size_after", 3}});
  for (int i = 0; i < 3; ++i) {
    rec({{"type", "trainer_event"},
         {"event", "stall"},
         {"failure", true},
         {"world_before", 4},
         {"world_after", 3},
         {"stall_s", 0.3}});
  }
  rec({{"type", "trainer_event"},
       {"event", "stall"},
       {"world_before", 3},
       {"world_after", 4},
       {"stall_s", "oops"}});
  rec({{"type", "trainer_event"}, {"event", "checkpoint_saved"}, {"ok", true}, {"seconds", 1.5}});
  rec({{"type", "trainer_event"}, {"event", "checkpoint_saved"}, {"ok", false}});
  rec({{"type", "generation"}, {"generation", 3}, {"reason", "Weird Reason!"}});
  const std::string t = m.Render(json::object());
  EXPECT_TRUE(Has(t, "edl_job_generations_total{job_name=\"j1\",reason=\"start\"} 1")) << t;
  EXPECT_TRUE(Has(t, "edl_job_generations_total{job_name=\"j1\",reason=\"failure\"} 1")) << t;
  EXPECT_TRUE(Has(t, "edl_job_generations_total{job_name=\"j1\",reason=\"other\"} 1")) << t;
  EXPECT_TRUE(Has(t, "edl_job_trainer_failures_total{job_name=\"j1\"} 1")) << t;
  EXPECT_TRUE(
      Has(t, "edl_job_stall_seconds_bucket{job_name=\"j1\",kind=\"failure\",le=\"0.25\"} 0"))
      << t;
  EXPECT_TRUE(Has(t, "edl_job_stall_seconds_bucket{job_name=\"j1\",kind=\"failure\",le=\"0.5\"} 3"))
      << t;
  EXPECT_TRUE(
      Has(t, "edl_job_stall_seconds_bucket{job_name=\"j1\",kind=\"failure\",le=\"+Inf\"} 3"))
      << t;
  EXPECT_TRUE(Has(t, "edl_job_stall_seconds_count{job_name=\"j1\",kind=\"failure\"} 3")) << t;
  EXPECT_EQ(t.find("kind=\"grow\""), std::string::npos)
      << "a stall_s that is not a number is ignored: " << t;
  EXPECT_TRUE(Has(t, "edl_job_checkpoint_saves_total{job_name=\"j1\"} 1")) << t;
  EXPECT_TRUE(Has(t, "edl_job_checkpoint_save_failures_total{job_name=\"j1\"} 1")) << t;
  EXPECT_TRUE(Has(t, "edl_job_checkpoint_save_seconds_sum{job_name=\"j1\"} 1.5")) << t;

  // The ring: generation, progress, failure and stall records, numbered; `since` picks up from
  // there.
  json all = json::parse(m.Recent("j1", 0));
  // 3 generations, 1 progress, 1 failed exit, 3 stalls (the malformed one is not there)
  ASSERT_EQ(all["records"].size(), 8u) << all.dump();
  EXPECT_EQ(all["records"][0]["type"], "generation");
  EXPECT_EQ(all["records"][2]["type"], "trainer_exit");
  EXPECT_EQ(all["records"][3]["failure"], true);
  EXPECT_EQ(all["records"][4]["type"], "stall");
  EXPECT_EQ(all["records"][4]["kind"], "failure");
  EXPECT_EQ(all["records"][4]["cost_s"], 0.3);
  const uint64_t mid = all["records"][2]["seq"].get<uint64_t>();
  json rest = json::parse(m.Recent("j1", mid));
  ASSERT_EQ(rest["records"].size(), 5u) << rest.dump();
  EXPECT_EQ(rest["next"], all["next"]);
  EXPECT_EQ(json::parse(m.Recent("j1", all["next"].get<uint64_t>()))["records"].size(), 0u);
  EXPECT_EQ(json::parse(m.Recent("j1", 1'000'000))["records"].size(), 8u)
      << "a newer server's numbers: from 0";
  EXPECT_EQ(json::parse(m.Recent("nobody", 0))["records"].size(), 0u);
}

// The stall a re-form cost and its phases, apart: a failure whose survivor stalled 9.7 s, 9.6 s of
// it an evaluation the fixed run does too, cost 0.1 s; the evaluation shows as its own phase.
TEST(MetricsTest, AStallIsItsCostWithItsPhasesApart) {
  ManualClock clock;
  ServerMetrics m(&clock);
  m.TrainerEvent("j", proto::DecodeTrainerEvent({{"event", "stall"},
                                                 {"generation", 4},
                                                 {"world_before", 4},
                                                 {"world_after", 3},
                                                 {"failure", true},
                                                 {"stall_s", 9.7},
                                                 {"lost_s", 0.02},
                                                 {"wait_generation_s", 0.03},
                                                 {"reform_s", 0.04},
                                                 {"sync_s", 0.0},
                                                 {"eval_s", 9.6},
                                                 {"first_step_s", 0.01}}));
  const std::string t = m.Render(json::object());
  EXPECT_TRUE(Has(t, "edl_job_stall_seconds_bucket{job_name=\"j\",kind=\"failure\",le=\"0.25\"} 1"))
      << t;
  EXPECT_TRUE(
      Has(t, "edl_job_stall_phase_seconds_bucket{job_name=\"j\",phase=\"eval\",le=\"5\"} 0"))
      << t;
  EXPECT_TRUE(
      Has(t, "edl_job_stall_phase_seconds_bucket{job_name=\"j\",phase=\"eval\",le=\"10\"} 1"))
      << t;
  EXPECT_TRUE(Has(t, "edl_job_stall_phase_seconds_count{job_name=\"j\",phase=\"reform\"} 1")) << t;
  EXPECT_EQ(t.find("phase=\"agree\""), std::string::npos)
      << "a phase not reported is not observed: " << t;
  const json recs = json::parse(m.Recent("j", 0))["records"];
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_NEAR(recs[0]["cost_s"].get<double>(), 0.1, 1e-9);
  EXPECT_EQ(recs[0]["eval_s"], 9.6);
  EXPECT_EQ(recs[0]["generation"], 4);
}

// Counters a rate() can be taken of: the job's committed steps and samples; and the accuracy.
TEST(MetricsTest, StepsAndSamplesAreCountersAndAccuracyAGauge) {
  ManualClock clock;
  ServerMetrics m(&clock);
  const json status = {{"job_id", "j"},
                       {"world_size", 2},
                       {"desired", 2},
                       {"generation", 3},
                       {"progress",
                        {{"reporting", 2},
                         {"step", 120},
                         {"epoch", 1},
                         {"loss", 0.5},
                         {"images_per_sec", 100.0},
                         {"accuracy", 0.875},
                         {"samples", 7680}}}};
  const std::string t = m.Render(status);
  EXPECT_TRUE(Has(t, "# TYPE edl_job_samples_total counter")) << t;
  EXPECT_TRUE(Has(t, "edl_job_samples_total{job_name=\"j\"} 7680")) << t;
  EXPECT_TRUE(Has(t, "edl_job_steps_total{job_name=\"j\"} 120")) << t;
  EXPECT_TRUE(Has(t, "edl_job_test_accuracy{job_name=\"j\"} 0.875")) << t;
  // A finished job runs no trainers; an older trainer's reports (no samples) make no counter.
  json done = status;
  done["done"] = true;
  done["progress"].erase("samples");
  const std::string d = m.Render(done);
  EXPECT_TRUE(Has(d, "edl_job_trainers{job_name=\"j\"} 0")) << d;
  EXPECT_EQ(d.find("edl_job_samples_total{"), std::string::npos) << d;
}

TEST(MetricsTest, WhatRecordsCanMakeItHoldIsBounded) {
  ManualClock clock;
  ServerMetrics m(&clock);
  for (size_t i = 0; i < ServerMetrics::kMaxJobs + 10; ++i) {
    m.OnRecord({{"type", "progress"}, {"job", "job" + std::to_string(i)}, {"time", 1.0}});
  }
  EXPECT_EQ(json::parse(m.Recent("job0", 0))["records"].size(), 0u)
      << "the least recently written job went";
  EXPECT_EQ(json::parse(m.Recent("job" + std::to_string(ServerMetrics::kMaxJobs + 9), 0))["records"]
                .size(),
            1u);
  for (size_t i = 0; i < ServerMetrics::kRingPerJob + 100; ++i) {
    m.OnRecord({{"type", "progress"}, {"job", "busy"}, {"time", 1.0}});
  }
  size_t kept = 0;
  uint64_t since = 0;
  for (int round = 0; round < 10; ++round) {
    const json r = json::parse(m.Recent("busy", since));
    kept += r["records"].size();
    EXPECT_LE(r["records"].size(), ServerMetrics::kMaxRecentPerReply);
    since = r["next"].get<uint64_t>();
  }
  EXPECT_EQ(kept, ServerMetrics::kRingPerJob);
  for (size_t i = 0; i < 2 * ServerMetrics::kMaxReasonsPerJob; ++i) {
    m.OnRecord({{"type", "generation"}, {"job", "busy"}, {"reason", "r" + std::to_string(i)}});
  }
  const std::string t = m.Render(json::object());
  size_t reasons = 0;
  for (size_t p = t.find("edl_job_generations_total{job_name=\"busy\""); p != std::string::npos;
       p = t.find("edl_job_generations_total{job_name=\"busy\"", p + 1)) {
    ++reasons;
  }
  EXPECT_EQ(reasons, ServerMetrics::kMaxReasonsPerJob + 1) << "then 'other': " << t;
  // Nodes go with their disconnect record.
  m.NodeHeard("n1");
  EXPECT_NE(m.Render(json::object()).find("node=\"n1\""), std::string::npos);
  m.OnRecord({{"type", "node_disconnected"}, {"job", "j"}, {"node", "n1"}});
  EXPECT_EQ(m.Render(json::object()).find("node=\"n1\""), std::string::npos);
}

TEST(MetricsTest, ClusterStatusAndPromtoolAcceptsTheText) {
  ManualClock clock;
  ServerMetrics m(&clock);
  proto::NodeStats st;
  st.cpu_busy = 2;
  st.cpu_cores = 8;
  st.gpu_util = 50;
  m.NodeStatsReported("gpu1", st);
  m.OnRecord({{"type", "generation"}, {"job", "a"}, {"reason", "policy"}});
  m.TrainerEvent(
      "a", proto::DecodeTrainerEvent(
               {{"event", "stall"}, {"world_before", 1}, {"world_after", 2}, {"stall_s", 0.2}}));
  m.HttpAnswered(200);
  const json status = {{"cluster", true},
                       {"total_slots", 16},
                       {"used_slots", 3},
                       {"nodes", 2},
                       {"jobs", json::array({{{"name", "a"},
                                              {"state", "running"},
                                              {"trainers", 2},
                                              {"target", 3},
                                              {"generation", 5},
                                              {"images_per_sec", 10.0},
                                              {"step", 7},
                                              {"epoch", 0},
                                              {"loss", 1.25},
                                              {"measured", {{"sync_s", 0.03}}}},
                                             {{"name", "b"},
                                              {"state", "pending"},
                                              {"trainers", 0},
                                              {"target", 0},
                                              {"generation", 0}}})},
                       {"services", json::object()}};
  const std::string t = m.Render(status);
  EXPECT_TRUE(Has(t, "edl_job_trainers{job_name=\"a\"} 2")) << t;
  EXPECT_TRUE(Has(t, "edl_job_desired_trainers{job_name=\"a\"} 3")) << t;
  EXPECT_TRUE(Has(t, "edl_job_state{job_name=\"b\",state=\"pending\"} 1")) << t;
  EXPECT_TRUE(Has(t, "edl_job_allreduce_seconds{job_name=\"a\"} 0.03")) << t;
  EXPECT_EQ(t.find("edl_job_gradient_noise_scale{job_name=\"b\"}"), std::string::npos) << t;
  EXPECT_EQ(t.find("edl_job_loss{job_name=\"b\"}"), std::string::npos)
      << "no trainers, no loss: " << t;
  EXPECT_TRUE(Has(t, "edl_node_cpu_utilization_ratio{node=\"gpu1\"} 0.25")) << t;
  EXPECT_TRUE(Has(t, "edl_node_gpu_utilization_ratio{node=\"gpu1\"} 0.5")) << t;
  EXPECT_TRUE(Has(t, "edl_cluster_slots 16")) << t;
  EXPECT_TRUE(Has(t, "edl_server_info{mode=\"cluster\"} 1")) << t;
  EXPECT_TRUE(Has(t, "edl_http_responses_total{code=\"200\"} 1")) << t;

  if (::access("/usr/bin/promtool", X_OK) != 0)
    GTEST_SKIP() << "no /usr/bin/promtool (Debian's prometheus)";
  test::ScratchDir dir("metrics");
  for (const std::string& text : {t, m.Render(SingleStatus())}) {
    std::ofstream(dir.Join("metrics.txt")) << text;
    const int rc = itest::RunCommand(
        {"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + dir.Join("metrics.txt")},
        dir.Join("promtool.out"), std::chrono::milliseconds(60000));
    EXPECT_EQ(rc, 0) << itest::Slurp(dir.Join("promtool.out")) << "\n" << text;
  }
}

// ---- the request-head parser

HttpRefusal Parse(const std::string& bytes, HttpRequestHead* head, HttpLimits limits = {}) {
  size_t consumed = 0;
  return ParseHttpRequestHead(bytes, limits, head, &consumed);
}

TEST(HttpRequestTest, KeepsWhatTheEndpointNeeds) {
  HttpRequestHead h;
  ASSERT_EQ(Parse("GET /api/events?job=a&since=3 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"
                  "Authorization: bearer  abc+/=\r\nX: y\r\n\r\n",
                  &h),
            HttpRefusal::kNone);
  EXPECT_EQ(h.method, HttpMethod::kGet);
  EXPECT_EQ(h.path, "/api/events");
  EXPECT_EQ(h.query, "job=a&since=3");
  EXPECT_EQ(h.host, "127.0.0.1:9");
  EXPECT_EQ(h.bearer, "abc+/=");
  EXPECT_EQ(h.fields, 3);
  ASSERT_EQ(Parse("HEAD / HTTP/1.0\r\n\r\n", &h), HttpRefusal::kNone);
  EXPECT_EQ(h.method, HttpMethod::kHead);
  EXPECT_FALSE(h.has_authorization);
  ASSERT_EQ(Parse("DELETE /x HTTP/1.1\r\nAuthorization: Basic Zm9v\r\n\r\n", &h),
            HttpRefusal::kNone);
  EXPECT_EQ(h.method, HttpMethod::kOther);  // the endpoint answers 405
  EXPECT_TRUE(h.has_authorization);
  EXPECT_EQ(h.bearer, "");
  std::map<std::string, std::string> q;
  EXPECT_TRUE(ParseHttpQuery("job=a.b_c-1&since=42", 8, &q));
  EXPECT_EQ(q["job"], "a.b_c-1");
  EXPECT_EQ(q["since"], "42");
  EXPECT_TRUE(ParseHttpQuery("", 8, &q));
  EXPECT_TRUE(q.empty());
}

TEST(HttpRequestTest, RefusesWhatAReadOnlyEndpointHasNoUseFor) {
  HttpRequestHead h;
  HttpLimits small;
  small.max_head_bytes = 256;
  small.max_fields = 4;
  small.max_target_bytes = 32;
  EXPECT_EQ(Parse("GET / HTTP/1.1\r\nX: " + std::string(400, 'a') + "\r\n\r\n", &h, small),
            HttpRefusal::kHeadTooLarge);
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 5; ++i) many += "X" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(Parse(many + "\r\n", &h, small), HttpRefusal::kHeadTooLarge);
  EXPECT_EQ(Parse("GET /" + std::string(40, 'a') + " HTTP/1.1\r\n\r\n", &h, small),
            HttpRefusal::kTargetTooLong);
  EXPECT_EQ(Parse("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", &h),
            HttpRefusal::kBodyNotAllowed);
  EXPECT_EQ(
      Parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &h),
      HttpRefusal::kBodyNotAllowed);
  EXPECT_EQ(Parse("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", &h), HttpRefusal::kBadRequest);
  EXPECT_EQ(
      Parse("GET / HTTP/1.1\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n", &h),
      HttpRefusal::kBadRequest);
  EXPECT_EQ(Parse("GET http://evil/ HTTP/1.1\r\n\r\n", &h), HttpRefusal::kBadRequest)
      << "origin-form only";
  EXPECT_EQ(Parse("GET / HTTP/2.0\r\n\r\n", &h), HttpRefusal::kBadRequest);
  EXPECT_EQ(Parse("GET /\r\n\r\n", &h), HttpRefusal::kBadRequest);
  EXPECT_EQ(Parse("GET / HTTP/1.1\r\nHost: a\r\n", &h), HttpRefusal::kBadRequest) << "ends early";
  EXPECT_EQ(Parse(std::string("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n", 26), &h),
            HttpRefusal::kBadRequest);
  EXPECT_EQ(HttpStatusOf(HttpRefusal::kHeadTooLarge), 431);
  std::map<std::string, std::string> q;
  EXPECT_FALSE(ParseHttpQuery("job=../../etc", 8, &q));
  EXPECT_FALSE(ParseHttpQuery("job=a&job=b", 8, &q));
  EXPECT_FALSE(ParseHttpQuery("=a", 8, &q));
  EXPECT_FALSE(ParseHttpQuery("job=%2e%2e", 8, &q));
  EXPECT_FALSE(ParseHttpQuery("a=1&b=2&c=3", 2, &q));
}

}  // namespace
}  // namespace edl::jobserver
