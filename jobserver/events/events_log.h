// EventsLog: the job's events as JSON lines in <events_dir>/<job_id>.events.jsonl, one record per
// generation change (reason, world size before/after, stall), node and trainer events, records
// trainers send through ReportEvent, "progress" (at most one a second) and "finished". Each record
// gets "time" (Unix seconds) and "job". A plot can be made from the file directly. An
// EventsObserver, when given, sees every record appended (the metrics and dashboard of `edl server
// --http_addr`, jobserver/http/metrics.h).
//
// Thread-safety: none; used from the server's io_context thread.
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"

namespace edl::jobserver {

// Sees each completed record as it is appended, on the thread that appends it.
class EventsObserver {
 public:
  virtual ~EventsObserver() = default;
  virtual void OnRecord(const nlohmann::json& record) = 0;
};

class EventsLog {
 public:
  // Creates `dir` when missing. IOError naming the path when it cannot be written. `observer`
  // (not owned; may be null) must outlive the log. `keep_open` false: the file is opened for each
  // record and closed after it (no descriptor held between records, for logs of the many jobs of a
  // cluster server).
  Status Open(const std::string& dir, const std::string& job_id, Clock* clock,
              EventsObserver* observer = nullptr, bool keep_open = true);
  // Adds time and job, appends one line, flushes. Returns the completed record.
  nlohmann::json Append(nlohmann::json record);
  const std::string& path() const { return path_; }

 private:
  void Write(const nlohmann::json& record);
  std::ofstream out_;
  bool keep_open_ = true;
  std::string path_, job_id_;
  Clock* clock_ = nullptr;              // not owned
  EventsObserver* observer_ = nullptr;  // not owned
};

}  // namespace edl::jobserver
