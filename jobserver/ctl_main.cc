#include "jobserver/ctl_main.h"

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <type_traits>
#include <sstream>

#include "edl/base/flags.h"
#include "edl/net/auth.h"
#include "edl/net/framed_socket.h"
#include "edl/proto/fields.h"
#include "edl/proto/messages.h"
#include "jobserver/job_spec.h"

namespace edl::jobserver {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kUsage[] =
    "usage: edl ctl --server HOST:PORT --secret_file FILE COMMAND\n\n"
    "commands:\n"
    "  status [--json]   the job the way EDL's monitor showed it, plus generation and progress\n"
    "  scale N           set the job's desired number of trainers\n"
    "  scale SERVICE N   run N teachers of a distillation service on the clients offering it (--service)\n"
    "  watch             print a line per change and every events-log record, until the server exits\n"
    "  stop              stop the whole job: one stop generation, rank 0 saves a final\n"
    "                    checkpoint, the trainers leave, then the clients and the server exit\n"
    "a cluster server (`edl server --cluster`) also takes:\n"
    "  submit JOB.ini    submit a job (name, type, min, max, priority, deadline_s, mode, [flags])\n"
    "  jobs [--json]     list the jobs: state, trainers, pending reason\n"
    "  cancel NAME       stop a job's trainers and forget it\n"
    "  scale NAME N      ask for N trainers of job NAME (within its min..max)";

std::string Pad(const std::string& s, size_t w) { return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' '); }

// A field of the server's reply, or `def` where the reply lacks it or holds another type. The
// server's bytes are a peer's like any other: a field of the wrong type shows as its default
// instead of throwing out of edl ctl.
template <typename T>
T Field(const json& o, const char* key, T def) {
  if (!o.is_object()) return def;
  auto it = o.find(key);
  if (it == o.end()) return def;
  if constexpr (std::is_same_v<T, json>) {
    return *it;
  } else if constexpr (std::is_same_v<T, bool>) {
    return it->is_boolean() ? it->template get<bool>() : def;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return it->is_string() ? it->template get<std::string>() : def;
  } else if constexpr (std::is_integral_v<T>) {
    int64_t v = 0;
    return proto::internal::GetInt(*it, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), &v)
               ? static_cast<T>(v) : def;
  } else {
    return it->is_number() ? it->template get<T>() : def;
  }
}

std::string Fixed(double v, int prec) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

// The cluster monitor line: the original EDL monitor's columns plus slot use and images/s.
std::string ClusterLine(const json& b) {
  const int total = Field(b, "total_slots", 0), used = Field(b, "used_slots", 0);
  const std::string running = Field(b, "running_trainers", std::string());
  auto pct = [&](const char* key) {
    const json v = Field(b, key, json("n/a"));
    return v.is_number() ? Fixed(v.get<double>(), 2) + "%" : std::string("n/a");
  };
  return Pad(std::to_string(Field(b, "submitted_jobs", 0)), 16) + Pad(std::to_string(Field(b, "pending_jobs", 0)), 14) +
         Pad(running.empty() ? "-" : running, 32) + Pad(pct("cpu_utils"), 11) + Pad(pct("gpu_utils"), 11) +
         Pad(std::to_string(used) + "/" + std::to_string(total), 8) + Fixed(Field(b, "images_per_sec", 0.0), 1);
}

std::string ClusterHeader() {
  return Pad("SUBMITTED-JOBS", 16) + Pad("PENDING-JOBS", 14) + Pad("RUNNING-TRAINERS", 32) + Pad("CPU-UTILS", 11) +
         Pad("GPU-UTILS", 11) + Pad("SLOTS", 8) + "IMAGES/S";
}

void PrintHealth(const json& j);

void PrintJobs(const json& b) {
  std::cout << Pad("JOB", 16) << Pad("TYPE", 12) << Pad("STATE", 9) << Pad("TRAINERS", 10) << Pad("MIN..MAX", 10)
            << Pad("PRIO", 6) << Pad("GEN", 6) << Pad("IMAGES/S", 10) << "PENDING-REASON\n";
  for (const json& j : Field(b, "jobs", json::array())) {
    std::cout << Pad(Field(j, "name", std::string()), 16) << Pad(Field(j, "type", std::string()), 12)
              << Pad(Field(j, "state", std::string()), 9) << Pad(std::to_string(Field(j, "trainers", 0)), 10)
              << Pad(std::to_string(Field(j, "min", 0)) + ".." + std::to_string(Field(j, "max", 0)), 10)
              << Pad(std::to_string(Field(j, "priority", 0)), 6) << Pad(std::to_string(Field(j, "generation", 0)), 6)
              << Pad(Fixed(Field(j, "images_per_sec", 0.0), 1), 10) << Field(j, "pending_reason", std::string("-"))
              << "\n";
    PrintHealth(j);
  }
  for (const json& j : Field(b, "ended", json::array())) {
    std::cout << Pad(Field(j, "name", std::string()), 16) << Pad(Field(j, "type", std::string()), 12)
              << Field(j, "state", std::string()) << "\n";
  }
}

void PrintServices(const json& b);

// What keeps a job from training, under its line: failures alike in a row with the trainers' last
// log line, seconds since the last step, checkpoint saves that failed or were refused, nodes whose
// joiner was refused.
void PrintHealth(const json& j) {
  const json failing = Field(j, "failing", json::object());
  if (!failing.empty()) {
    std::cout << "  failing: " << Field(failing, "exits", 0) << " trainers in a row ended with "
              << Field(failing, "how", std::string("?")) << "; last log line: "
              << proto::Quote(Field(failing, "last_error", std::string()), 200) << "\n";
  }
  const json last = Field(j, "last_progress_s", json());
  if (last.is_number()) std::cout << "  last progress: " << Fixed(last.get<double>(), 1) << " s ago\n";
  const json ckpt = Field(j, "checkpoint_failures", json::object());
  if (!ckpt.empty()) {
    std::cout << "  checkpoint saves failed: " << Field(ckpt, "failed", 0) << " (refused by the store's fence: "
              << Field(ckpt, "refused", 0) << "), the last at step " << Field(ckpt, "last_step", int64_t{-1}) << ": "
              << proto::Quote(Field(ckpt, "last_error", std::string()), 300) << "\n";
  }
  const json refused = Field(j, "refused_nodes", json::object());
  if (refused.is_object()) {
    for (const auto& [node, why] : refused.items()) {
      std::cout << "  node " << node << " gets no joiner: " << (why.is_string() ? why.get<std::string>() : "?") << "\n";
    }
  }
}

void PrintStatus(const json& b) {
  if (Field(b, "cluster", false)) {
    std::cout << ClusterHeader() << "\n" << ClusterLine(b) << "\n\n";
    PrintJobs(b);
    PrintServices(b);
    return;
  }
  const int world = Field(b, "world_size", 0);
  const bool done = Field(b, "done", false);
  const int running = Field(b, "running", world);  // members that have not exited
  const int total = Field(b, "total_slots", 0), used = Field(b, "used_slots", 0);
  const std::string job = Field(b, "job_id", std::string("?"));
  const std::string util = std::to_string(used) + "/" + std::to_string(total) + " (" +
                           Fixed(total > 0 ? 100.0 * used / total : 0.0, 1) + "%)";
  std::cout << Pad("SUBMITTED-JOBS", 18) << Pad("PENDING-JOBS", 16) << Pad("RUNNING-TRAINERS", 20)
            << "SLOT-UTILS\n";
  std::cout << Pad("1", 18) << Pad(world == 0 && !done ? "1" : "0", 16)
            << Pad(job + ":" + std::to_string(running), 20) << util << "\n\n";
  const json p = Field(b, "progress", json::object());
  std::string state = done                                      ? "finished"
                      : !Field(b, "failing", json::object()).empty() ? "failing"
                      : Field(b, "pending", false)                  ? "joining"
                      : world > 0                                   ? "running"
                                                                    : "pending";
  std::cout << Pad("JOB", 14) << Pad("GEN", 6) << Pad("REASON", 12) << Pad("WORLD", 7) << Pad("DESIRED", 9)
            << Pad("NODES", 7) << Pad("STEP", 9) << Pad("EPOCH", 7) << Pad("LOSS", 9) << Pad("IMAGES/S", 10)
            << "STATE\n";
  const int desired = Field(b, "desired", 0);
  std::cout << Pad(job, 14) << Pad(std::to_string(Field(b, "generation", 0)), 6)
            << Pad(Field(b, "reason", std::string("-")), 12) << Pad(std::to_string(world), 7)
            << Pad(desired > 0 ? std::to_string(desired) : "all", 9)
            << Pad(std::to_string(Field(b, "nodes", json::array()).size()), 7)
            << Pad(std::to_string(Field(p, "step", 0)), 9) << Pad(std::to_string(Field(p, "epoch", 0)), 7)
            << Pad(Field(p, "reporting", 0) > 0 ? Fixed(Field(p, "loss", 0.0), 4) : "-", 9)
            << Pad(Field(p, "reporting", 0) > 0 ? Fixed(Field(p, "images_per_sec", 0.0), 1) : "-", 10)
            << state << "\n";
  PrintHealth(b);
  PrintServices(b);
}

// Inference services (teachers of distilling students): one line per teacher, then the teachers
// the clients run per service (`scale SERVICE N`).
void PrintServices(const json& b) {
  const json services = Field(b, "services", json::object());
  if (!services.is_object() || services.empty()) return;
  std::cout << "\n" << Pad("SERVICE", 14) << Pad("TEACHER", 20) << Pad("ADDRESS", 22) << Pad("REQ/S", 9)
            << Pad("SAMPLES/S", 11) << Pad("LATENCY-MS", 12) << "STUDENTS\n";
  for (const auto& [name, s] : services.items()) {
    const std::string students = std::to_string(Field(s, "students", 0));
    const json teachers = Field(s, "teachers", json::array());
    if (teachers.empty()) std::cout << Pad(name, 14) << Pad("-", 20) << Pad("-", 22) << Pad("-", 9) << Pad("-", 11) << Pad("-", 12) << students << "\n";
    for (const json& t : teachers) {
      std::cout << Pad(name, 14) << Pad(Field(t, "name", std::string("?")), 20)
                << Pad(Field(t, "host", std::string("?")) + ":" + std::to_string(Field(t, "port", 0)), 22)
                << Pad(Fixed(Field(t, "requests_per_sec", 0.0), 1), 9)
                << Pad(Fixed(Field(t, "samples_per_sec", 0.0), 1), 11)
                << Pad(Fixed(Field(t, "latency_ms", 0.0), 1), 12) << students << "\n";
    }
  }
  // Teachers the clients run (`scale SERVICE N`): desired count, placed teachers, replacements.
  for (const auto& [name, s] : services.items()) {
    if (!s.contains("placed")) continue;
    std::string placed;
    for (const json& p : Field(s, "placed", json::array())) {
      placed += (placed.empty() ? "" : ", ") + Field(p, "name", std::string("?")) +
                (Field(p, "stopping", false) ? " (stopping)" : "") +
                (Field(p, "awaiting_node", false) ? " (its node has not re-attached)" : "");
    }
    const int64_t desired = Field<int64_t>(s, "desired", -1);
    const auto pe = s.find("preempted");
    const int64_t preempted = pe != s.end() && pe->is_number_integer() ? pe->get<int64_t>() : 0;
    std::cout << "service " << name << ": desired " << (desired >= 0 ? std::to_string(desired) : "-")
              << ", placed " << Field(s, "placed", json::array()).size() << (placed.empty() ? "" : " (" + placed + ")") << ", replaced "
              << Field(s, "restarts", 0) << (preempted > 0 ? ", gave " + std::to_string(preempted) + " slot(s) to jobs" : "")
              << ", offered by " << Field(s, "nodes", json::array()).size() << " node(s)\n";
  }
}

std::string StatusLine(const json& b) {
  if (Field(b, "cluster", false)) return ClusterLine(b);
  const json p = Field(b, "progress", json::object());
  return "generation=" + std::to_string(Field(b, "generation", 0)) + " reason=" +
         Field(b, "reason", std::string("-")) + " world=" + std::to_string(Field(b, "world_size", 0)) +
         " desired=" + std::to_string(Field(b, "desired", 0)) + " slots=" +
         std::to_string(Field(b, "used_slots", 0)) + "/" + std::to_string(Field(b, "total_slots", 0)) +
         " epoch=" + std::to_string(Field(p, "epoch", 0)) + " step=" + std::to_string(Field(p, "step", 0)) +
         " loss=" + (Field(p, "reporting", 0) > 0 ? Fixed(Field(p, "loss", 0.0), 4) : "-") +
         " images/s=" + Fixed(Field(p, "images_per_sec", 0.0), 1) +
         (Field(b, "done", false) ? " finished" : "");
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
  return servers.size() == 1 ? last : last.WithContext("no server of --server " + server + " answered; the last");
}

Status Call(net::FramedSocket* sock, const proto::CtlRequest& req, proto::CtlReply* rep) {
  json j;
  req.EncodeTo(&j);
  EDL_RETURN_IF_ERROR(sock->Send(j, milliseconds(5000)));
  EDL_RETURN_IF_ERROR(sock->Receive(&j, milliseconds(10000)).WithContext("waiting for the server's reply"));
  if (j["type"] == proto::msg::kError) {
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
  const json stopped = Field(rep.body, "stopped", json::object());
  std::cout << "job stopped" << (Field(stopped, "final_checkpoint", std::string()) == "saved" ? "; final checkpoint saved" : "")
            << (Field(stopped, "not_left", 0) > 0 ? "; " + std::to_string(Field(stopped, "not_left", 0)) +
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
      if (rep.body.contains("event")) std::cout << "event " << rep.body["event"].dump() << std::endl;
      if (rep.body.contains("status")) {
        const std::string line = StatusLine(rep.body["status"]);
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
  if (text.size() > 64 * 1024) return Status::InvalidArgument("job file " + path + " is over 64 KiB");
  return ParseJobIni(text, spec).WithContext(path);
}

// Fills `req` from the command `c` and its positional arguments.
Status BuildRequest(const std::string& c, const std::vector<std::string>& args, proto::CtlRequest* req) {
  using Command = proto::CtlCommand;
  if (!proto::kCtlCommandNames.Parse(c, &req->command)) {
    return Status::InvalidArgument(c.empty() ? "no command" : "unknown command '" + c + "'");
  }
  auto count = [&](size_t lo, size_t hi, const char* usage) {
    return args.size() >= lo && args.size() <= hi ? Status::OK()
                                                  : Status::InvalidArgument(std::string("usage: edl ctl ") + usage);
  };
  auto number = [](const std::string& v, int64_t* n, int64_t lo) {
    char* end = nullptr;
    *n = std::strtoll(v.c_str(), &end, 10);
    return !v.empty() && *end == '\0' && *n >= lo && *n <= 65536
               ? Status::OK()
               : Status::InvalidArgument("'" + v + "' is not a number in " + std::to_string(lo) + "..65536");
  };
  switch (req->command) {
    case Command::kStatus:
    case Command::kWatch:
    case Command::kStop:
    case Command::kJobs:
      return count(0, 0, c.c_str());
    case Command::kScale:
      EDL_RETURN_IF_ERROR(count(1, 2, "scale N  |  scale SERVICE N  |  scale NAME N (cluster)"));
      if (args.size() == 2) req->job = args[0];
      return number(args.back(), &req->n, args.size() == 2 ? 0 : 1);  // a service may go to 0
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
  std::string server, secret_file, command;
  std::vector<std::string> args;
  bool as_json = false;
  d.add_options()
      ("server", po::value<std::string>(&server)->default_value("127.0.0.1:8180"), "the server's HOST:PORT, or a comma-separated list of a leader and its standbys (the first that answers)")
      ("secret_file", po::value<std::string>(&secret_file), "cluster secret shared by every node (required)")
      ("json", po::bool_switch(&as_json), "status: print the raw JSON")
      ("command", po::value<std::string>(&command), "status | scale | watch | stop | submit | jobs | cancel")
      ("args", po::value<std::vector<std::string>>(&args), "the command's arguments");
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
  s = BuildRequest(command, args, &req);
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
      std::cout << "submitted job " << req.spec.value("name", std::string()) << "\n";
      break;
    case Command::kCancel:
      std::cout << "cancelled job " << req.job << "\n";
      break;
    case Command::kScale:
      if (Field(Field(rep.body, "services", json::object()), req.job.c_str(), json::object()).contains("placed")) {
        std::cout << "service " << req.job << ": desired teachers set to " << req.n << "\n";
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
      std::cout << "stopping job " << Field(rep.body, "job_id", std::string()) << " and its server\n";
      return StopOutcome(sock.get(), Field(rep.body, "stop_timeout_s", int64_t{-1}));
  }
  return 0;
}

}  // namespace edl::jobserver
