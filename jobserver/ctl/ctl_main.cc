#include "jobserver/ctl/ctl_main.h"

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <type_traits>

#include "edl/base/flags.h"
#include "edl/net/auth.h"
#include "edl/net/framed_socket.h"
#include "edl/proto/fields.h"
#include "edl/proto/frame.h"
#include "edl/proto/messages.h"
#include "jobserver/policy/job_spec.h"

namespace edl::jobserver {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kUsage[] =
    "usage: edl ctl --server HOST:PORT --secret_file FILE COMMAND\n\n"
    "commands:\n"
    "  status [--json]   the job the way EDL's monitor showed it, plus generation and progress\n"
    "  scale N           set the job's desired number of trainers\n"
    "  scale --service SERVICE N\n"
    "                    run N teachers of a distillation service on the clients offering it\n"
    "  watch             print a line per change and every events-log record, until the server "
    "exits\n"
    "  stop              stop the whole job: one stop generation, rank 0 saves a final\n"
    "                    checkpoint, the trainers leave, then the clients and the server exit\n"
    "a cluster server (`edl server --cluster`) also takes:\n"
    "  submit JOB.ini    submit a job (name, type, min, max, priority, deadline_s, mode, [flags])\n"
    "  jobs [--json]     list the jobs: state, trainers, pending reason\n"
    "  cancel NAME       stop a job's trainers and forget it\n"
    "  scale --job NAME N  ask for N trainers of job NAME (within its min..max)";

std::string Pad(const std::string& s, size_t w) {
  return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' ');
}

// A field of the server's reply, or `def` where the reply lacks it or holds another type. The
// server's bytes are a peer's like any other: a field of the wrong type shows as its default
// instead of throwing out of edl ctl.
using proto::FieldOf;
using proto::FieldOr;

std::string Fixed(double v, int prec) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

// The cluster monitor line: the original EDL monitor's columns plus slot use and images/s.
std::string ClusterLine(const json& b) {
  const int total = FieldOr(b, "total_slots", 0), used = FieldOr(b, "used_slots", 0);
  const std::string running = FieldOr(b, "running_trainers", std::string());
  auto pct = [&](const char* key) {
    return FieldOf(b, key).is_number() ? Fixed(proto::NumOr(b, key), 2) + "%" : std::string("n/a");
  };
  return Pad(std::to_string(FieldOr(b, "submitted_jobs", 0)), 16) +
         Pad(std::to_string(FieldOr(b, "pending_jobs", 0)), 14) +
         Pad(running.empty() ? "-" : running, 32) + Pad(pct("cpu_utils"), 11) +
         Pad(pct("gpu_utils"), 11) + Pad(std::to_string(used) + "/" + std::to_string(total), 8) +
         Fixed(FieldOr(b, "images_per_sec", 0.0), 1);
}

std::string ClusterHeader() {
  return Pad("SUBMITTED-JOBS", 16) + Pad("PENDING-JOBS", 14) + Pad("RUNNING-TRAINERS", 32) +
         Pad("CPU-UTILS", 11) + Pad("GPU-UTILS", 11) + Pad("SLOTS", 8) + "IMAGES/S";
}

void PrintHealth(const json& j);
void PrintMeasured(const json& m);

void PrintJobs(const json& b) {
  std::cout << Pad("JOB", 16) << Pad("TYPE", 12) << Pad("STATE", 9) << Pad("TRAINERS", 10)
            << Pad("MIN..MAX", 10) << Pad("PRIO", 6) << Pad("GEN", 6) << Pad("IMAGES/S", 10)
            << "PENDING-REASON\n";
  for (const json& j : FieldOr(b, "jobs", json::array())) {
    std::cout << Pad(FieldOr(j, "name", std::string()), 16)
              << Pad(FieldOr(j, "type", std::string()), 12)
              << Pad(FieldOr(j, "state", std::string()), 9)
              << Pad(std::to_string(FieldOr(j, "trainers", 0)), 10)
              << Pad(std::to_string(FieldOr(j, "min", 0)) + ".." +
                         std::to_string(FieldOr(j, "max", 0)),
                     10)
              << Pad(std::to_string(FieldOr(j, "priority", 0)), 6)
              << Pad(std::to_string(FieldOr(j, "generation", 0)), 6)
              << Pad(Fixed(FieldOr(j, "images_per_sec", 0.0), 1), 10)
              << FieldOr(j, "pending_reason", std::string("-")) << "\n";
    PrintHealth(j);
    PrintMeasured(FieldOr(j, "measured", json::object()));
  }
  for (const json& j : FieldOr(b, "ended", json::array())) {
    std::cout << Pad(FieldOr(j, "name", std::string()), 16)
              << Pad(FieldOr(j, "type", std::string()), 12) << FieldOr(j, "state", std::string())
              << "\n";
  }
}

void PrintServices(const json& b);

// What keeps a job from training, under its line: failures alike in a row with the trainers' last
// log line, seconds since the last step, checkpoint saves that failed or were refused, nodes whose
// joiner was refused.
// What a job measures of itself (Cluster::MeasuredJson), one line; nothing while nothing is.
void PrintMeasured(const json& m) {
  std::string line;
  if (FieldOf(m, "noise_steps").is_number()) {
    const double scale = proto::NumOr(m, "noise_scale", -1);
    line += "gradient noise scale " +
            (scale >= 0 ? Fixed(scale, 0) + " samples" : "not yet known") + " (|G|^2 " +
            Fixed(proto::NumOr(m, "grad_sqr"), 4) + ", tr(Sigma) " +
            Fixed(proto::NumOr(m, "grad_var"), 4) + ", over " +
            std::to_string(FieldOr(m, "noise_steps", 0)) + " steps)";
  }
  if (FieldOf(m, "compute_s_per_sample").is_number()) {
    line += std::string(line.empty() ? "" : "; ") + "compute " +
            Fixed(1000 * proto::NumOr(m, "compute_s_per_sample"), 2) + " ms a sample";
  }
  if (FieldOf(m, "sync_s").is_number()) {
    line += std::string(line.empty() ? "" : ", ") + "all-reduce " +
            Fixed(1000 * proto::NumOr(m, "sync_s"), 1) + " ms a step at world " +
            std::to_string(FieldOr(m, "sync_world", 0)) + " on " +
            std::to_string(FieldOr(m, "sync_nodes", 0)) +
            (FieldOr(m, "sync_nodes", 0) == 1 ? " node" : " nodes");
  }
  if (!line.empty()) std::cout << "  measured: " << line << "\n";
}

void PrintHealth(const json& j) {
  const json failing = FieldOr(j, "failing", json::object());
  if (!failing.empty()) {
    std::cout << "  failing: " << FieldOr(failing, "exits", 0) << " trainers in a row ended with "
              << FieldOr(failing, "how", std::string("?")) << "; last log line: "
              << proto::Quote(FieldOr(failing, "last_error", std::string()), 200) << "\n";
  }
  if (FieldOf(j, "last_progress_s").is_number()) {
    std::cout << "  last progress: " << Fixed(proto::NumOr(j, "last_progress_s"), 1) << " s ago\n";
  }
  const json ckpt = FieldOr(j, "checkpoint_failures", json::object());
  if (!ckpt.empty()) {
    std::cout << "  checkpoint saves failed: " << FieldOr(ckpt, "failed", 0)
              << " (refused by the store's fence: " << FieldOr(ckpt, "refused", 0)
              << "), the last at step " << FieldOr(ckpt, "last_step", int64_t{-1}) << ": "
              << proto::Quote(FieldOr(ckpt, "last_error", std::string()), 300) << "\n";
  }
  const json refused = FieldOr(j, "refused_nodes", json::object());
  if (refused.is_object()) {
    for (const auto& [node, why] : refused.items()) {
      std::cout << "  node " << node
                << " gets no joiner: " << proto::StrOr(refused, node.c_str(), "?") << "\n";
    }
  }
}

void PrintStatus(const json& b) {
  if (FieldOr(b, "cluster", false)) {
    std::cout << ClusterHeader() << "\n" << ClusterLine(b) << "\n\n";
    PrintJobs(b);
    PrintServices(b);
    return;
  }
  const int world = FieldOr(b, "world_size", 0);
  const bool done = FieldOr(b, "done", false);
  const int running = FieldOr(b, "running", world);  // members that have not exited
  const int total = FieldOr(b, "total_slots", 0), used = FieldOr(b, "used_slots", 0);
  const std::string job = FieldOr(b, "job_id", std::string("?"));
  const std::string util = std::to_string(used) + "/" + std::to_string(total) + " (" +
                           Fixed(total > 0 ? 100.0 * used / total : 0.0, 1) + "%)";
  std::cout << Pad("SUBMITTED-JOBS", 18) << Pad("PENDING-JOBS", 16) << Pad("RUNNING-TRAINERS", 20)
            << "SLOT-UTILS\n";
  std::cout << Pad("1", 18) << Pad(world == 0 && !done ? "1" : "0", 16)
            << Pad(job + ":" + std::to_string(running), 20) << util << "\n\n";
  const json p = FieldOr(b, "progress", json::object());
  std::string state = done                                             ? "finished"
                      : !FieldOr(b, "failing", json::object()).empty() ? "failing"
                      : FieldOr(b, "pending", false)                   ? "joining"
                      : world > 0                                      ? "running"
                                                                       : "pending";
  std::cout << Pad("JOB", 14) << Pad("GEN", 6) << Pad("REASON", 12) << Pad("WORLD", 7)
            << Pad("DESIRED", 9) << Pad("NODES", 7) << Pad("STEP", 9) << Pad("EPOCH", 7)
            << Pad("LOSS", 9) << Pad("IMAGES/S", 10) << "STATE\n";
  const int desired = FieldOr(b, "desired", 0);
  std::cout << Pad(job, 14) << Pad(std::to_string(FieldOr(b, "generation", 0)), 6)
            << Pad(FieldOr(b, "reason", std::string("-")), 12) << Pad(std::to_string(world), 7)
            << Pad(desired > 0 ? std::to_string(desired) : "all", 9)
            << Pad(std::to_string(FieldOr(b, "nodes", json::array()).size()), 7)
            << Pad(std::to_string(FieldOr(p, "step", 0)), 9)
            << Pad(std::to_string(FieldOr(p, "epoch", 0)), 7)
            << Pad(FieldOr(p, "reporting", 0) > 0 ? Fixed(FieldOr(p, "loss", 0.0), 4) : "-", 9)
            << Pad(FieldOr(p, "reporting", 0) > 0 ? Fixed(FieldOr(p, "images_per_sec", 0.0), 1)
                                                  : "-",
                   10)
            << state << "\n";
  PrintHealth(b);
  PrintMeasured(FieldOr(p, "measured", json::object()));
  PrintServices(b);
}

// Inference services (teachers of distilling students): one line per teacher, then the teachers
// the clients run per service (`scale --service SERVICE N`).
void PrintServices(const json& b) {
  const json services = FieldOr(b, "services", json::object());
  if (!services.is_object() || services.empty()) return;
  std::cout << "\n"
            << Pad("SERVICE", 14) << Pad("TEACHER", 20) << Pad("ADDRESS", 22) << Pad("REQ/S", 9)
            << Pad("SAMPLES/S", 11) << Pad("LATENCY-MS", 12) << "STUDENTS\n";
  for (const auto& [name, s] : services.items()) {
    const std::string students = std::to_string(FieldOr(s, "students", 0));
    const json teachers = FieldOr(s, "teachers", json::array());
    if (teachers.empty())
      std::cout << Pad(name, 14) << Pad("-", 20) << Pad("-", 22) << Pad("-", 9) << Pad("-", 11)
                << Pad("-", 12) << students << "\n";
    for (const json& t : teachers) {
      std::cout << Pad(name, 14) << Pad(FieldOr(t, "name", std::string("?")), 20)
                << Pad(FieldOr(t, "host", std::string("?")) + ":" +
                           std::to_string(FieldOr(t, "port", 0)),
                       22)
                << Pad(Fixed(FieldOr(t, "requests_per_sec", 0.0), 1), 9)
                << Pad(Fixed(FieldOr(t, "samples_per_sec", 0.0), 1), 11)
                << Pad(Fixed(FieldOr(t, "latency_ms", 0.0), 1), 12) << students << "\n";
    }
  }
  // Teachers the clients run (`scale --service SERVICE N`): desired count, placed teachers,
  // replacements.
  for (const auto& [name, s] : services.items()) {
    if (!s.contains("placed")) continue;
    std::string placed;
    for (const json& p : FieldOr(s, "placed", json::array())) {
      placed += (placed.empty() ? "" : ", ") + FieldOr(p, "name", std::string("?")) +
                (FieldOr(p, "stopping", false) ? " (stopping)" : "") +
                (FieldOr(p, "awaiting_node", false) ? " (its node has not re-attached)" : "");
    }
    const int64_t desired = FieldOr<int64_t>(s, "desired", -1);
    const int64_t preempted = FieldOr<int64_t>(s, "preempted", 0);
    std::cout << "service " << name << ": desired "
              << (desired >= 0 ? std::to_string(desired) : "-") << ", placed "
              << FieldOr(s, "placed", json::array()).size()
              << (placed.empty() ? "" : " (" + placed + ")") << ", replaced "
              << FieldOr(s, "restarts", 0)
              << (preempted > 0 ? ", gave " + std::to_string(preempted) + " slot(s) to jobs" : "")
              << ", offered by " << FieldOr(s, "nodes", json::array()).size() << " node(s)\n";
  }
}

std::string StatusLine(const json& b) {
  if (FieldOr(b, "cluster", false)) return ClusterLine(b);
  const json p = FieldOr(b, "progress", json::object());
  const bool done =
      FieldOr(b, "done", false);  // a finished job runs no trainer, whatever its last world
  return "generation=" + std::to_string(FieldOr(b, "generation", 0)) +
         " reason=" + FieldOr(b, "reason", std::string("-")) +
         " world=" + std::to_string(done ? 0 : FieldOr(b, "world_size", 0)) +
         " desired=" + std::to_string(FieldOr(b, "desired", 0)) +
         " slots=" + std::to_string(FieldOr(b, "used_slots", 0)) + "/" +
         std::to_string(FieldOr(b, "total_slots", 0)) +
         " epoch=" + std::to_string(FieldOr(p, "epoch", 0)) +
         " step=" + std::to_string(FieldOr(p, "step", 0)) +
         " loss=" + (FieldOr(p, "reporting", 0) > 0 ? Fixed(FieldOr(p, "loss", 0.0), 4) : "-") +
         " images/s=" + Fixed(FieldOr(p, "images_per_sec", 0.0), 1) +
         (done ? " finished (last world " + std::to_string(FieldOr(b, "world_size", 0)) + ")" : "");
}

// Connects to the first server of the comma-separated `server` list that accepts and
// authenticates us (a leader and its standbys: standbys do not listen; docs/CHECKPOINTS.md "Standby
// servers").
Status Connect(const std::string& server, const std::string& secret_file,
               std::unique_ptr<net::FramedSocket>* out) {
  std::vector<std::pair<std::string, int>> servers;
  std::string secret;
  EDL_RETURN_IF_ERROR(net::ParseHostPortList(server, "--server", &servers));
  EDL_RETURN_IF_ERROR(net::ReadSecretFile(secret_file, &secret));
  Status last;
  for (const auto& [host, port] : servers) {
    auto sock = net::FramedSocket::ConnectTcp(host, port, milliseconds(5000));
    if (!sock.ok()) {
      last = sock.status();
      if (last.code() == Status::Code::kUnavailable) {
        last = Status::Unavailable(
            last.message() + ": is `edl server` running on " + host +
            ", and does --server name its --server_port (default 8180; the scripts' "
            "EDL_SERVER_PORT)?");
      }
      continue;
    }
    proto::Hello hello;
    hello.role = proto::Role::kCtl;
    proto::Welcome w;
    last = net::AuthenticateToServer(sock.value().get(), secret, hello, milliseconds(5000), &w);
    if (last.ok()) {
      *out = std::move(sock.value());
      return Status::OK();
    }
    if (last.code() == Status::Code::kUnauthenticated) break;  // the same secret fails everywhere
  }
  return servers.size() == 1
             ? last
             : last.WithContext("no server of --server " + server + " answered; the last");
}

Status Call(net::FramedSocket* sock, const proto::CtlRequest& req, proto::CtlReply* rep) {
  json j;
  req.EncodeTo(&j);
  EDL_RETURN_IF_ERROR(sock->Send(j, milliseconds(5000)));
  EDL_RETURN_IF_ERROR(
      sock->Receive(&j, milliseconds(10000)).WithContext("waiting for the server's reply"));
  if (proto::TypeOf(j) == proto::msg::kError) {
    proto::ErrorMsg e;
    EDL_RETURN_IF_ERROR(e.DecodeFrom(j));
    return e.ToStatus();
  }
  EDL_RETURN_IF_ERROR(rep->DecodeFrom(j));
  return rep->status;
}

// After `stop` was accepted with trainers to wait for (`timeout_s` >= 0, the server's
// --stop_timeout_s): the server's word on how the stop ended, when it has one. 1 when the final
// checkpoint failed or was refused (the stop itself went through), 0 otherwise.
int StopOutcome(net::FramedSocket* sock, int64_t timeout_s) {
  if (timeout_s < 0) return 0;  // stopped at once: nothing ran
  json j;
  Status s = sock->Receive(&j, milliseconds((timeout_s + 30) * 1000));
  proto::CtlReply rep;
  if (!s.ok() || !rep.DecodeFrom(j).ok() || !rep.body.contains("stopped")) {
    std::cout << "the server stopped without saying how the final checkpoint went"
              << (s.ok() ? "" : " (" + s.message() + ")") << "\n";
    return 0;
  }
  if (!rep.status.ok()) {
    std::cerr << "edl ctl stop: " << rep.status.ToString() << "\n";
    return 1;
  }
  const json stopped = FieldOr(rep.body, "stopped", json::object());
  std::cout << "job stopped"
            << (FieldOr(stopped, "final_checkpoint", std::string()) == "saved"
                    ? "; final checkpoint saved"
                    : "")
            << (FieldOr(stopped, "not_left", 0) > 0
                    ? "; " + std::to_string(FieldOr(stopped, "not_left", 0)) +
                          " trainer(s) did not leave in time and were stopped by their clients"
                    : "")
            << "\n";
  return 0;
}

int Watch(net::FramedSocket* sock) {
  proto::CtlRequest req;
  req.command = proto::CtlCommand::kWatch;
  proto::CtlReply rep;
  Status s = Call(sock, req, &rep);
  if (!s.ok()) {
    std::cerr << "edl ctl watch: " << s.ToString() << "\n";
    return 1;
  }
  std::string last = StatusLine(rep.body);
  std::cout << "status " << last << std::endl;
  while (true) {
    json j;
    s = sock->Receive(&j, milliseconds(3600 * 1000));
    if (s.IsTimeout()) continue;
    if (!s.ok()) {
      std::cout << "server closed the connection: " << s.message() << std::endl;
      return 0;
    }
    if (rep.DecodeFrom(j).ok()) {
      const json& event = FieldOf(rep.body, "event");
      if (!event.is_null())
        std::cout << "event " << event.dump(-1, ' ', false, json::error_handler_t::replace)
                  << std::endl;
      if (const json& status = FieldOf(rep.body, "status"); !status.is_null()) {
        const std::string line = StatusLine(status);
        if (line != last) std::cout << "status " << line << std::endl;
        last = line;
      }
    }
  }
}

// Reads JOB.ini for `submit` (at most 64 KiB: a job description, not data).
Status ReadJobFile(const std::string& path, JobSpec* spec) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read job file " + path);
  std::string text(64 * 1024 + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > 64 * 1024)
    return Status::InvalidArgument("job file " + path + " is over 64 KiB");
  return ParseJobIni(text, spec).WithContext(path);
}

// Fills `req` from the command `c`, its positional arguments and --job / --service (`scale`).
Status BuildRequest(const std::string& c, const std::vector<std::string>& args,
                    const std::string& job, const std::string& service, proto::CtlRequest* req) {
  using Command = proto::CtlCommand;
  if (!proto::kCtlCommandNames.Parse(c, &req->command)) {
    return Status::InvalidArgument(c.empty() ? "no command" : "unknown command '" + c + "'");
  }
  auto count = [&](size_t lo, size_t hi, const char* usage) {
    return args.size() >= lo && args.size() <= hi
               ? Status::OK()
               : Status::InvalidArgument(std::string("usage: edl ctl ") + usage);
  };
  // N of `scale`: the trainers of a job (at least 1; a job ends by `edl ctl stop`) or the
  // teachers of a service (0 stops them all).
  auto number = [](const std::string& v, int64_t* n, int64_t lo) {
    char* end = nullptr;
    errno = 0;
    *n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno == ERANGE) {
      return Status::InvalidArgument(
          "scale: '" + v + "' is not a number; N is how many trainers (or teachers) to run");
    }
    if (*n < lo) {
      return Status::InvalidArgument(
          "scale: N is " + v + ", but " +
          (lo == 1 ? "a job runs at least 1 trainer; to end a job use `edl ctl stop`"
                   : "a count cannot be negative"));
    }
    if (*n > 65536) return Status::InvalidArgument("scale: N is " + v + ", more than 65536");
    return Status::OK();
  };
  switch (req->command) {
    case Command::kStatus:
    case Command::kWatch:
    case Command::kStop:
    case Command::kJobs:
      return count(0, 0, c.c_str());
    case Command::kScale:
      if (args.size() == 2) {
        return Status::InvalidArgument("scale " + args[0] + " " + args[1] + ": say what " +
                                       args[0] + " is: `edl ctl scale --job " + args[0] + " " +
                                       args[1] +
                                       "` (a cluster's job) or `edl ctl scale --service " +
                                       args[0] + " " + args[1] + "` (a distillation service)");
      }
      EDL_RETURN_IF_ERROR(count(1, 1, "scale N  |  scale --job NAME N  |  scale --service NAME N"));
      if (!job.empty() && !service.empty()) {
        return Status::InvalidArgument("scale: give --job or --service, not both");
      }
      req->job = job;
      req->service = service;
      return number(args.back(), &req->n, service.empty() ? 1 : 0);  // a service may go to 0
    case Command::kCancel:
      EDL_RETURN_IF_ERROR(count(1, 1, "cancel NAME"));
      req->job = args[0];
      return Status::OK();
    case Command::kSubmit: {
      EDL_RETURN_IF_ERROR(count(1, 1, "submit JOB.ini"));
      JobSpec spec;
      EDL_RETURN_IF_ERROR(ReadJobFile(args[0], &spec));
      req->spec = EncodeJobSpec(spec);
      return Status::OK();
    }
  }
  return Status::Internal("unhandled command '" + c + "'");
}

}  // namespace

int RunCtlMain(int argc, char** argv) {
  po::options_description d("ctl");
  std::string server, secret_file, command, job, service;
  std::vector<std::string> args;
  bool as_json = false;
  d.add_options()("server", po::value<std::string>(&server)->default_value("127.0.0.1:8180"),
                  "the server's HOST:PORT, or a comma-separated list of a leader and its standbys "
                  "(the first that answers)")("secret_file", po::value<std::string>(&secret_file),
                                              "cluster secret shared by every node (required)")(
      "json", po::bool_switch(&as_json), "status: print the raw JSON")(
      "job", po::value<std::string>(&job),
      "scale: the job to scale (a cluster server's; the single job by default)")(
      "service", po::value<std::string>(&service),
      "scale: the distillation service whose teachers to scale")(
      "command", po::value<std::string>(&command),
      "status | scale | watch | stop | submit | jobs | cancel")(
      "args", po::value<std::vector<std::string>>(&args), "the command's arguments");
  po::positional_options_description pos;
  pos.add("command", 1).add("args", -1);
  ParsedFlags pf;
  Status s = ParseFlags("ctl", kUsage, d, argc, argv, &pf, &pos);
  if (!s.ok()) {
    std::cerr << "edl ctl: " << s.ToString() << "\n";
    return 2;
  }
  if (pf.help) return 0;
  proto::CtlRequest req;
  s = BuildRequest(command, args, job, service, &req);
  if (!s.ok()) {
    std::cerr << "edl ctl: " << s.message() << "\n\n" << kUsage << "\n";
    return 2;
  }
  std::unique_ptr<net::FramedSocket> sock;
  s = Connect(server, secret_file, &sock);
  if (!s.ok()) {
    std::cerr << "edl ctl: " << s.ToString() << "\n";
    return s.code() == Status::Code::kInvalidArgument ? 2 : 1;
  }
  using Command = proto::CtlCommand;
  if (req.command == Command::kWatch) return Watch(sock.get());
  proto::CtlReply rep;
  s = Call(sock.get(), req, &rep);
  if (!s.ok()) {
    std::cerr << "edl ctl " << command << ": " << s.ToString() << "\n";
    return 1;
  }
  switch (req.command) {
    case Command::kSubmit:
      std::cout << "submitted job " << proto::StrOr(req.spec, "name") << "\n";
      break;
    case Command::kCancel:
      std::cout << "cancelled job " << req.job << "\n";
      break;
    case Command::kScale:
      if (!req.service.empty()) {
        std::cout << "service " << req.service << ": desired teachers set to " << req.n << "\n";
      } else if (!req.job.empty()) {
        std::cout << "job " << req.job << " asked for " << req.n << " trainers\n";
      } else {
        std::cout << "desired size set to " << req.n << "; now " << StatusLine(rep.body) << "\n";
      }
      break;
    case Command::kJobs:
    case Command::kStatus:
      if (as_json) {
        std::cout << rep.body.dump(2) << "\n";
      } else if (req.command == Command::kJobs) {
        PrintJobs(rep.body);
      } else {
        PrintStatus(rep.body);
      }
      break;
    case Command::kWatch:  // Watch() above
      break;
    case Command::kStop:
      std::cout << "stopping job " << FieldOr(rep.body, "job_id", std::string())
                << " and its server\n";
      return StopOutcome(sock.get(), FieldOr(rep.body, "stop_timeout_s", int64_t{-1}));
  }
  return 0;
}

}  // namespace edl::jobserver
