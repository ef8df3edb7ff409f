#include "jobserver/ctl_main.h"

#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "edl/base/flags.h"
#include "edl/net/auth.h"
#include "edl/net/framed_socket.h"
#include "edl/proto/messages.h"

namespace edl::jobserver {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kUsage[] =
    "usage: edl ctl --server HOST:PORT --secret_file FILE COMMAND\n\n"
    "commands:\n"
    "  status [--json]   the job the way EDL's monitor showed it, plus generation and progress\n"
    "  scale N           set the job's desired number of trainers\n"
    "  watch             print a line per change and every events-log record, until the server exits\n"
    "  stop              stop every trainer and the server";

std::string Pad(const std::string& s, size_t w) { return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' '); }

std::string Fixed(double v, int prec) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

void PrintStatus(const json& b) {
  const int world = b.value("world_size", 0);
  const bool done = b.value("done", false);
  const int total = b.value("total_slots", 0), used = b.value("used_slots", 0);
  const std::string job = b.value("job_id", std::string("?"));
  const std::string util = std::to_string(used) + "/" + std::to_string(total) + " (" +
                           Fixed(total > 0 ? 100.0 * used / total : 0.0, 1) + "%)";
  std::cout << Pad("SUBMITTED-JOBS", 18) << Pad("PENDING-JOBS", 16) << Pad("RUNNING-TRAINERS", 20)
            << "SLOT-UTILS\n";
  std::cout << Pad("1", 18) << Pad(world == 0 && !done ? "1" : "0", 16)
            << Pad(job + ":" + std::to_string(world), 20) << util << "\n\n";
  const json p = b.value("progress", json::object());
  std::string state = done ? "finished" : b.value("pending", false) ? "joining" : world > 0 ? "running" : "pending";
  std::cout << Pad("JOB", 14) << Pad("GEN", 6) << Pad("REASON", 12) << Pad("WORLD", 7) << Pad("DESIRED", 9)
            << Pad("NODES", 7) << Pad("STEP", 9) << Pad("EPOCH", 7) << Pad("LOSS", 9) << Pad("IMAGES/S", 10)
            << "STATE\n";
  const int desired = b.value("desired", 0);
  std::cout << Pad(job, 14) << Pad(std::to_string(b.value("generation", 0)), 6)
            << Pad(b.value("reason", std::string("-")), 12) << Pad(std::to_string(world), 7)
            << Pad(desired > 0 ? std::to_string(desired) : "all", 9)
            << Pad(std::to_string(b.value("nodes", json::array()).size()), 7)
            << Pad(std::to_string(p.value("step", 0)), 9) << Pad(std::to_string(p.value("epoch", 0)), 7)
            << Pad(p.value("reporting", 0) > 0 ? Fixed(p.value("loss", 0.0), 4) : "-", 9)
            << Pad(p.value("reporting", 0) > 0 ? Fixed(p.value("images_per_sec", 0.0), 1) : "-", 10)
            << state << "\n";
  // Inference services (teachers of distilling students): one line per teacher.
  const json services = b.value("services", json::object());
  if (!services.is_object() || services.empty()) return;
  std::cout << "\n" << Pad("SERVICE", 14) << Pad("TEACHER", 20) << Pad("ADDRESS", 22) << Pad("REQ/S", 9)
            << Pad("SAMPLES/S", 11) << Pad("LATENCY-MS", 12) << "STUDENTS\n";
  for (const auto& [name, s] : services.items()) {
    const std::string students = std::to_string(s.value("students", 0));
    const json teachers = s.value("teachers", json::array());
    if (teachers.empty()) std::cout << Pad(name, 14) << Pad("-", 20) << Pad("-", 22) << Pad("-", 9) << Pad("-", 11) << Pad("-", 12) << students << "\n";
    for (const json& t : teachers) {
      std::cout << Pad(name, 14) << Pad(t.value("name", std::string("?")), 20)
                << Pad(t.value("host", std::string("?")) + ":" + std::to_string(t.value("port", 0)), 22)
                << Pad(Fixed(t.value("requests_per_sec", 0.0), 1), 9)
                << Pad(Fixed(t.value("samples_per_sec", 0.0), 1), 11)
                << Pad(Fixed(t.value("latency_ms", 0.0), 1), 12) << students << "\n";
    }
  }
}

std::string StatusLine(const json& b) {
  const json p = b.value("progress", json::object());
  return "generation=" + std::to_string(b.value("generation", 0)) + " reason=" +
         b.value("reason", std::string("-")) + " world=" + std::to_string(b.value("world_size", 0)) +
         " desired=" + std::to_string(b.value("desired", 0)) + " slots=" +
         std::to_string(b.value("used_slots", 0)) + "/" + std::to_string(b.value("total_slots", 0)) +
         " epoch=" + std::to_string(p.value("epoch", 0)) + " step=" + std::to_string(p.value("step", 0)) +
         " loss=" + (p.value("reporting", 0) > 0 ? Fixed(p.value("loss", 0.0), 4) : "-") +
         " images/s=" + Fixed(p.value("images_per_sec", 0.0), 1) +
         (b.value("done", false) ? " finished" : "");
}

Status Connect(const std::string& server, const std::string& secret_file,
               std::unique_ptr<net::FramedSocket>* out) {
  std::string host, secret;
  int port = 0;
  EDL_RETURN_IF_ERROR(net::ParseHostPort(server, "--server", &host, &port));
  EDL_RETURN_IF_ERROR(net::ReadSecretFile(secret_file, &secret));
  auto sock = net::FramedSocket::ConnectTcp(host, port, milliseconds(5000));
  if (!sock.ok()) return sock.status();
  proto::Hello hello;
  hello.role = "ctl";
  proto::Welcome w;
  EDL_RETURN_IF_ERROR(net::AuthenticateToServer(sock.value().get(), secret, hello, milliseconds(5000), &w));
  *out = std::move(sock.value());
  return Status::OK();
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

int Watch(net::FramedSocket* sock) {
  proto::CtlRequest req;
  req.command = "watch";
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

}  // namespace

int RunCtlMain(int argc, char** argv) {
  po::options_description d("ctl");
  std::string server, secret_file, command;
  int64_t n = -1;
  bool as_json = false;
  d.add_options()
      ("server", po::value<std::string>(&server)->default_value("127.0.0.1:8180"), "the server's HOST:PORT")
      ("secret_file", po::value<std::string>(&secret_file), "cluster secret shared by every node (required)")
      ("json", po::bool_switch(&as_json), "status: print the raw JSON")
      ("command", po::value<std::string>(&command), "status | scale | watch | stop")
      ("n", po::value<int64_t>(&n), "scale: the new desired number of trainers");
  po::positional_options_description pos;
  pos.add("command", 1).add("n", 1);
  ParsedFlags pf;
  Status s = ParseFlags("ctl", kUsage, d, argc, argv, &pf, &pos);
  if (!s.ok()) {
    std::cerr << "edl ctl: " << s.ToString() << "\n";
    return 2;
  }
  if (pf.help) return 0;
  if (command != "status" && command != "scale" && command != "watch" && command != "stop") {
    std::cerr << "edl ctl: " << (command.empty() ? "no command" : "unknown command '" + command + "'")
              << "\n\n" << kUsage << "\n";
    return 2;
  }
  if (command == "scale" && n < 1) {
    std::cerr << "edl ctl: scale needs a number of trainers >= 1, e.g. `edl ctl scale 4`\n";
    return 2;
  }
  std::unique_ptr<net::FramedSocket> sock;
  s = Connect(server, secret_file, &sock);
  if (!s.ok()) {
    std::cerr << "edl ctl: " << s.ToString() << "\n";
    return s.code() == Status::Code::kInvalidArgument ? 2 : 1;
  }
  if (command == "watch") return Watch(sock.get());
  proto::CtlRequest req;
  req.command = command;
  req.n = command == "scale" ? n : 0;
  proto::CtlReply rep;
  s = Call(sock.get(), req, &rep);
  if (!s.ok()) {
    std::cerr << "edl ctl " << command << ": " << s.ToString() << "\n";
    return 1;
  }
  if (command == "status") {
    if (as_json) {
      std::cout << rep.body.dump(2) << "\n";
    } else {
      PrintStatus(rep.body);
    }
  } else if (command == "scale") {
    std::cout << "desired size set to " << n << "; now " << StatusLine(rep.body) << "\n";
  } else {
    std::cout << "stopping job " << rep.body.value("job_id", std::string()) << " and its server\n";
  }
  return 0;
}

}  // namespace edl::jobserver
