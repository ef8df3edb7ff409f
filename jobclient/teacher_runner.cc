#include "jobclient/teacher_runner.h"

#include <unistd.h>

#include <thread>

#include <glog/logging.h>

namespace edl::jobclient {

namespace {
constexpr const char* kAppended[] = {"--service",     "--name",           "--server",
                                     "--secret_file", "--advertise_host", "--exit_with_parent"};
}  // namespace

Status CheckServiceCommand(const std::string& service, const std::vector<std::string>& argv) {
  if (argv.empty())
    return Status::InvalidArgument("--service " + service + ": no command after '='");
  for (const std::string& a : argv) {
    for (const char* flag : kAppended) {
      const std::string f = flag;
      if (a == f || a.rfind(f + "=", 0) == 0) {
        return Status::InvalidArgument(
            "--service " + service + ": the command sets " + f +
            "; leave it out, the client adds --service, --name, --server, "
            "--secret_file, --advertise_host and --exit_with_parent itself");
      }
    }
  }
  return Status::OK();
}

TeacherRunner::TeacherRunner(launcher::ProcessLauncher* launcher, TeacherRunnerOptions options)
    : launcher_(launcher), options_(std::move(options)) {}

TeacherRunner::~TeacherRunner() { StopAll(std::chrono::milliseconds(options_.stop_grace_ms)); }

std::vector<std::string> TeacherRunner::Services() const {
  std::vector<std::string> out;
  for (const auto& [name, argv] : options_.commands) out.push_back(name);
  return out;
}

Status TeacherRunner::Start(const std::string& service, const std::string& name,
                            const std::string& server) {
  auto cmd = options_.commands.find(service);
  if (cmd == options_.commands.end()) {
    return Status::FailedPrecondition("this node offers no service '" + service + "'");
  }
  if (teachers_.count(name)) return Status::FailedPrecondition("teacher " + name + " runs already");
  if (static_cast<int>(teachers_.size()) >= options_.slots) {
    return Status::FailedPrecondition("all " + std::to_string(options_.slots) +
                                      " teacher slots are taken");
  }
  launcher::TrainerSpec spec;
  spec.argv = cmd->second;
  spec.argv.insert(spec.argv.end(),
                   {"--service", service, "--name", name, "--server", server, "--secret_file",
                    options_.secret_file, "--advertise_host", options_.advertise_host,
                    "--exit_with_parent", std::to_string(::getpid())});
  spec.log_path = options_.log_dir + "/teacher-" + name + ".log";
  auto proc = launcher_->Start(spec);
  if (!proc.ok()) return proc.status();
  LOG(INFO) << "teacher " << name << " of service " << service << " started, pid "
            << proc.value()->pid() << ", log " << spec.log_path;
  teachers_[name] = Teacher{service, std::move(proc.value()), 0};
  return Status::OK();
}

bool TeacherRunner::Stop(const std::string& name, int64_t now_us) {
  auto it = teachers_.find(name);
  if (it == teachers_.end()) return false;
  if (it->second.kill_at_us == 0) {
    it->second.kill_at_us = now_us + options_.stop_grace_ms * 1000;
    it->second.proc->Terminate();
  }
  return true;
}

std::vector<proto::TeacherOrder> TeacherRunner::Poll(int64_t now_us) {
  std::vector<proto::TeacherOrder> out;
  for (auto it = teachers_.begin(); it != teachers_.end();) {
    launcher::ExitInfo info;
    if (!it->second.proc->Poll(&info)) {
      if (it->second.kill_at_us > 0 && now_us >= it->second.kill_at_us) {
        LOG(WARNING) << "teacher " << it->first << " ignored SIGTERM for the stop grace; SIGKILL";
        it->second.proc->Kill();
        it->second.kill_at_us = INT64_MAX;
      }
      ++it;
      continue;
    }
    LOG(INFO) << "teacher " << it->first << " (pid " << it->second.proc->pid()
              << ") ended: " << info.ToString();
    proto::TeacherOrder e;
    e.type = proto::TeacherOrderType::kExit;
    e.service = it->second.service;
    e.name = it->first;
    e.why = info.ToString().substr(0, proto::kMaxTeacherWhyBytes);
    out.push_back(std::move(e));
    it = teachers_.erase(it);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> TeacherRunner::Running() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, t] : teachers_) {
    if (t.kill_at_us == 0) out.emplace_back(t.service, name);
  }
  return out;
}

void TeacherRunner::StopAll(std::chrono::milliseconds grace) {
  for (auto& [name, t] : teachers_) t.proc->Terminate();
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (auto& [name, t] : teachers_) {
    launcher::ExitInfo info;
    while (!t.proc->Poll(&info) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!t.proc->Poll(&info)) info = t.proc->Stop(std::chrono::milliseconds(0));
    LOG(INFO) << "teacher " << name << " stopped: " << info.ToString();
  }
  teachers_.clear();
}

}  // namespace edl::jobclient
