// ServerMetrics: what `edl server --http_addr` serves about the cluster
// (jobserver/http/http_endpoint.h) beyond the status body `edl ctl status --json` prints: counters
// the server feeds as things happen, and the Prometheus text exposition of both.
//
// Fed by
//  - OnRecord: every record an events log appends (EventsLog's observer): generations by reason,
//    the trainers' stall reports (a histogram by kind), trainer failures, checkpoint saves, nodes
//    leaving; and a bounded ring per job of the records the dashboard's timeline draws (Recent);
//  - the server's transport: connections opened and closed, frames refused by reason, each
//    authenticated node frame (the heartbeat age) and node_stats report;
//  - the HTTP endpoint: its answers by status code and its open connections.
// Render turns a status body (single job or cluster; the same JSON as /api/status) and these
// counters into Prometheus text: `edl_` prefix, base units (seconds, ratios), `_total` counters,
// label values escaped; a job is labelled `job_name` (Prometheus keeps `job` for the scrape job).
// Everything a peer can make it hold is bounded: jobs (kMaxJobs, the least recently written
// dropped), reasons per job, ring entries per job; nodes are dropped with their node_disconnected
// or node_lost record.
//
// Thread-safety: none; used on the server's io_context thread.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/proto/messages.h"
#include "jobserver/events/events_log.h"

namespace edl::jobserver {

// Why the server refused a frame (a closed set: the label values of
// edl_server_frames_refused_total).
enum class FrameRefusal {
  kUnauthenticated,  // a peer without the secret: bad MAC, or anything but hello first
  kInvalid,          // an authenticated peer's malformed or unexpected frame (the peer is closed)
  kNotPlaced,        // a report about a trainer no job placed on the sender's node
  kEventLimit,       // a trainer event over the size or rate bound, or of another record type
  kEvicted,          // a pre-auth connection dropped to admit a newer one
  kMalformedEvent,   // a trainer event that is not a valid event (proto/trainer_events.h): dropped
  kHandlerError,     // a frame whose handling failed unexpectedly: its connection was closed
  kCount
};
const char* FrameRefusalName(FrameRefusal r);

// Prometheus histogram with fixed bucket bounds (upper bounds, seconds).
class Histogram {
 public:
  static constexpr std::array<double, 11> kBounds = {0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                                     5,    10,  30,   60,  300};
  void Observe(double v);
  // `name`_bucket / _sum / _count lines with `labels` (`k="v",...` or "") before "le".
  void Render(const std::string& name, const std::string& labels, std::string* out) const;
  uint64_t count() const { return count_; }

 private:
  std::array<uint64_t, kBounds.size()> buckets_{};  // not cumulative; Render sums
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics : public EventsObserver {
 public:
  static constexpr size_t kMaxJobs = 256;          // jobs whose counters and ring are kept
  static constexpr size_t kMaxReasonsPerJob = 16;  // then "other"
  static constexpr size_t kRingPerJob = 2048;      // timeline records kept per job (~150 B each)
  static constexpr size_t kMaxRecentPerReply = 2048;

  // `clock` is not owned and must outlive this.
  explicit ServerMetrics(Clock* clock);

  // Every events-log record but trainer events, which come typed (TrainerEvent).
  void OnRecord(const nlohmann::json& record) override;
  // A trainer event of `job` the server accepted: stalls and checkpoint saves are counted.
  void TrainerEvent(const std::string& job, const proto::TrainerEventBody& event);
  void ConnectionOpened();
  void ConnectionClosed();
  void FrameRefused(FrameRefusal why);
  void NodeHeard(const std::string& node);
  void NodeStatsReported(const std::string& node, const proto::NodeStats& stats);
  void HttpAnswered(int status_code);
  void HttpConnectionOpened();
  void HttpConnectionClosed();

  // The Prometheus text exposition (format 0.0.4) of `status` and the counters.
  std::string Render(const nlohmann::json& status) const;
  // The timeline records of `job` after sequence number `since` (at most kMaxRecentPerReply, the
  // oldest first), as JSON text: {"job", "next" (pass as `since` next time), "records": [...]};
  // each record has "seq". A `since` beyond every number given out (a restarted server) is read
  // as 0. `job` must be a valid name (proto::IsValidName).
  std::string Recent(const std::string& job, uint64_t since) const;
  // What the server knows of each node beyond the status body, for the dashboard:
  // {"nodes": {NAME: {"heartbeat_age_s", "cpu_utilization", "gpu_utilization" (ratios; absent
  // where not reported)}}}.
  nlohmann::json NodesJson() const;

 private:
  struct Job {
    std::map<std::string, uint64_t> generations;  // by reason
    std::array<Histogram, 4> stalls;              // by StallKind: the re-form's cost
    std::array<Histogram, 7> stall_phases;        // by phase (kStallPhases)
    uint64_t trainer_failures = 0;
    uint64_t checkpoint_saves = 0;
    uint64_t checkpoint_failures = 0;
    Histogram checkpoint_seconds;
    struct Entry {
      uint64_t seq;
      std::string json;  // compact, with "seq"
    };
    std::deque<Entry> ring;   // timeline records
    uint64_t last_write = 0;  // sequence number of its newest record (LRU)
  };
  struct Node {
    int64_t heard_us = 0;
    bool has_stats = false;
    proto::NodeStats stats;
  };
  Job* JobFor(const std::string& name);
  void Keep(Job* job, nlohmann::json entry);
  void RenderJobs(const nlohmann::json& status, std::string* out) const;
  void RenderNodes(const nlohmann::json& status, std::string* out) const;
  void RenderServices(const nlohmann::json& status, std::string* out) const;
  void RenderServer(const nlohmann::json& status, std::string* out) const;

  Clock* const clock_;  // not owned
  const int64_t start_wall_us_;
  const int64_t start_us_;
  uint64_t seq_ = 0;  // records seen
  std::map<std::string, Job> jobs_;
  std::map<std::string, Node> nodes_;
  int64_t connections_ = 0;
  uint64_t connections_total_ = 0;
  std::array<uint64_t, static_cast<size_t>(FrameRefusal::kCount)> refused_{};
  std::map<int, uint64_t> http_answers_;  // by status code (the endpoint answers a closed set)
  int64_t http_connections_ = 0;
};

}  // namespace edl::jobserver
