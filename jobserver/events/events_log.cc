#include "jobserver/events/events_log.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <glog/logging.h>

namespace edl::jobserver {

Status EventsLog::Open(const std::string& dir, const std::string& job_id, Clock* clock,
                       EventsObserver* observer, bool keep_open) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("--events_dir " + dir + ": cannot create it: " + ec.message());
  path_ = dir + "/" + job_id + ".events.jsonl";
  out_.open(path_, std::ios::app);
  if (!out_) return PosixError("--events_dir: cannot open " + path_ + " for appending", errno);
  if (!keep_open) out_.close();
  keep_open_ = keep_open;
  job_id_ = job_id;
  clock_ = clock;
  observer_ = observer;
  return Status::OK();
}

nlohmann::json EventsLog::Append(nlohmann::json record) {
  record["time"] = static_cast<double>(clock_->WallMicros()) * 1e-6;
  record["job"] = job_id_;
  Write(record);
  if (observer_ != nullptr) observer_->OnRecord(record);
  return record;
}

void EventsLog::Write(const nlohmann::json& record) {
  if (!keep_open_) out_.open(path_, std::ios::app);
  if (!out_) {
    LOG_EVERY_N(ERROR, 100) << "events log " << path_
                            << ": cannot open it for appending: " << std::strerror(errno);
    out_.clear();
    return;
  }
  out_ << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  out_.flush();
  if (!out_) LOG(ERROR) << "events log " << path_ << ": write failed (disk full?)";
  if (!keep_open_) out_.close();
}

}  // namespace edl::jobserver
