// TeacherRunner: the `edl teacher` processes a client runs for the server's services
// (docs/DISTILLATION.md, "Teachers run by the clients"; PROTOCOL.md, "Services: teachers run by
// clients"). The command of each service comes from the client's own configuration (`--service NAME
// = COMMAND...`), never from the network: the server only names the service and the teacher. The
// runner appends what ties the teacher to this server and node (--service, --name, --server,
// --secret_file, --advertise_host, and --exit_with_parent: a client killed outright leaves no
// teacher behind), so the configured command must not set those itself (CheckServiceCommand).
//
// Thread-safety: none; used from the client's io_context thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "edl/base/status.h"
#include "edl/proto/service_messages.h"
#include "launcher/launcher.h"

namespace edl::jobclient {

struct TeacherRunnerOptions {
  std::map<std::string, std::vector<std::string>> commands;  // service -> argv
  int slots = 1;                                             // teachers at once
  std::string secret_file;                                   // passed on as --secret_file
  std::string advertise_host;                                // where students reach this node
  std::string log_dir;                                       // <log_dir>/teacher-<name>.log
  int64_t stop_grace_ms = 10000;                             // SIGTERM -> SIGKILL
};

// InvalidArgument when `argv` (a --service command) is empty or sets a flag the runner appends.
Status CheckServiceCommand(const std::string& service, const std::vector<std::string>& argv);

class TeacherRunner {
 public:
  // `launcher` is not owned and must outlive the runner.
  TeacherRunner(launcher::ProcessLauncher* launcher, TeacherRunnerOptions options);
  ~TeacherRunner();  // stops every teacher (StopAll)

  std::vector<std::string> Services() const;
  int slots() const { return options_.slots; }
  // Starts teacher `name` of `service`, registering with `server` (HOST:PORT). FailedPrecondition
  // when this node does not offer the service, runs `name` already or has no free teacher slot; the
  // launcher's error otherwise.
  Status Start(const std::string& service, const std::string& name, const std::string& server);
  // SIGTERM now; Poll sends SIGKILL after the grace. False when no teacher `name` runs.
  bool Stop(const std::string& name, int64_t now_us);
  // Teachers that ended since the last call, as teacher_exit messages; SIGKILLs those past their
  // stop grace.
  std::vector<proto::TeacherOrder> Poll(int64_t now_us);
  // The running teachers as [service, name] pairs (for the client's hello after a reconnect).
  std::vector<std::pair<std::string, std::string>> Running() const;
  // Stops every teacher: SIGTERM, up to `grace` to exit, then SIGKILL.
  void StopAll(std::chrono::milliseconds grace);

 private:
  struct Teacher {
    std::string service;
    std::unique_ptr<launcher::TrainerProcess> proc;
    int64_t kill_at_us = 0;  // > 0: stopping, SIGKILL at this time
  };
  launcher::ProcessLauncher* const launcher_;  // not owned
  const TeacherRunnerOptions options_;
  std::map<std::string, Teacher> teachers_;  // by name
};

}  // namespace edl::jobclient
