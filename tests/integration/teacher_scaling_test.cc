// Teacher counts that survive the server and that the scaling script drives (docs/DISTILLATION.md,
// "Teachers run by the clients"; jobserver/state/STATE.md, "Keys": services), with a real `edl
// server`, real `edl client`s running stand-in trainers, and a stand-in teacher command (a shell
// script that records its pid and name, then runs until stopped or until its client is gone):
//  - a service scaled to 2 over two clients; the server is SIGKILLed and started again on the same
//    --state_dir and port while one client is stopped (SIGSTOP): the other re-attaches first and
//    gets no extra teacher (the stopped client's teacher still counts); once both are back,
//    `ctl status` says desired 2 with the same two teachers (same pids), and no third one was
//    ever ordered;
//  - `teachers kd N` lines of a scaling script take the service 0 -> 2 -> 1 as `ctl scale` would;
//  - a `--cluster` server keeps the service across a SIGKILL the same way, and its teachers run
//    only in trainer slots no job holds: a submitted job takes their slots (they are stopped,
//    `preempted`), and they come back when it is cancelled.
#include <signal.h>

#include <filesystem>
#include <set>

#include <gtest/gtest.h>

#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using itest::json;
using itest::milliseconds;
using itest::Proc;
using itest::Slurp;
using itest::WaitFor;

class TeacherScalingTest : public itest::ControlPlaneHarness {
 protected:
  void SetUp() override {
    ControlPlaneHarness::SetUp();
    teachers_ = dir_.Join("teachers.txt");
    // The client appends --service kd --name NAME ... to the command: "$*" holds the name.
    std::ofstream(dir_.Join("teacher.sh"))
        << "echo \"$$ $*\" >> " << teachers_ << "\n"
        << "trap 'exit 0' TERM\n"
        << "while kill -0 $PPID 2>/dev/null; do sleep 0.2; done\n";
  }
  void TearDown() override {
    // Stand-ins left by a failed test (a recorded pid that still runs this test's script).
    for (const auto& [name, pid] : TeacherPids()) {
      if (Slurp("/proc/" + std::to_string(pid) + "/cmdline").find(dir_.Join("teacher.sh")) !=
          std::string::npos) {
        ::kill(pid, SIGKILL);
      }
    }
  }

  // The stand-in teachers that started: name -> pid.
  std::map<std::string, int> TeacherPids() {
    std::map<std::string, int> out;
    std::istringstream in(Slurp(teachers_));
    for (std::string line; std::getline(in, line);) {
      std::istringstream ls(line);
      int pid = 0;
      ls >> pid;
      for (std::string a; ls >> a;) {
        if (a == "--name" && (ls >> a)) out[a] = pid;
      }
    }
    return out;
  }

  // A single-job server (2 trainers), or with `cluster` a cluster server.
  std::unique_ptr<Proc> StartServerOn(const std::string& port,
                                      const std::vector<std::string>& extra, bool cluster = false) {
    std::remove(dir_.Join("port").c_str());
    std::vector<std::string> argv = {test::EdlBinary(),
                                     "server",
                                     "--server_port",
                                     port,
                                     "--bind",
                                     "127.0.0.1",
                                     "--port_file",
                                     dir_.Join("port"),
                                     "--secret_file",
                                     secret_,
                                     "--job_id",
                                     "itest",
                                     "--events_dir",
                                     dir_.Join("events"),
                                     "--heartbeat_timeout_ms",
                                     "10000",
                                     "--join_timeout_s",
                                     "60"};
    if (cluster) {
      argv.push_back("--cluster");
    } else {
      argv.insert(argv.end(), {"--min_trainers", "1", "--trainers", "2"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = std::make_unique<Proc>(argv, dir_.Join("server.log"));
    port_ = itest::WaitForPortFile(dir_.Join("port"), p.get());
    return p;
  }

  std::unique_ptr<Proc> StartTeacherClient(const std::string& node, const std::string& slots = "1",
                                           const std::string& job_type = "") {
    std::map<std::string, std::string> flags = {
        {"slots", slots},
        {"service", "kd = /bin/sh " + dir_.Join("teacher.sh")},
        {"teacher_slots", "2"}};
    if (!job_type.empty()) flags["job_type"] = job_type;
    return StartClient(node, "inplace", "", flags);
  }

  // `ctl status --json`'s services.kd (empty when absent or the reply is not JSON).
  json Kd() {
    std::string out;
    if (Ctl({"status", "--json"}, &out) != 0) return json::object();
    const size_t brace = out.find('{');
    const json j = json::parse(brace == std::string::npos ? "" : out.substr(brace), nullptr, false);
    if (!j.is_object() || !j.contains("services") || !j["services"].is_object() ||
        !j["services"].contains("kd")) {
      return json::object();
    }
    return j["services"]["kd"];
  }
  // The teachers placed and not being stopped, and those being stopped.
  static std::set<std::string> Placed(const json& kd, bool stopping = false) {
    std::set<std::string> out;
    if (!kd.is_object()) return out;
    for (const json& t : kd.value("placed", json::array())) {
      if (t.value("stopping", false) == stopping) out.insert(t.value("name", std::string()));
    }
    return out;
  }
  static size_t Count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }

  // `ctl scale kd N`, then waits until `running` stand-ins started; their names (all placed).
  std::map<std::string, int> ScaleAndWait(const std::string& n, size_t running) {
    std::string out;
    EXPECT_EQ(Ctl({"scale", "--service", "kd", n}, &out), 0) << out;
    EXPECT_TRUE(WaitFor([&] { return TeacherPids().size() == running; }, milliseconds(60000)))
        << Diagnostics();
    const std::map<std::string, int> pids = TeacherPids();
    EXPECT_EQ(Placed(Kd()), Names(pids));
    return pids;
  }
  // SIGKILLs the server and starts it again on the same port and state; the log's size before.
  size_t RestartServer(std::unique_ptr<Proc>* server, const std::vector<std::string>& state,
                       bool cluster) {
    EXPECT_EQ(::kill((*server)->pid(), SIGKILL), 0);
    EXPECT_EQ((*server)->Wait(milliseconds(10000)), 128 + SIGKILL);
    const size_t log_before = Slurp(dir_.Join("server.log")).size();
    *server = StartServerOn(port_, state, cluster);
    EXPECT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
    return log_before;
  }
  // Waits until `n` clients offering kd are attached; services.kd then (each reply follows a
  // placement pass, so the teachers shown include any the attach made it order).
  json KdWithNodes(size_t n) {
    json kd;
    EXPECT_TRUE(WaitFor(
        [&] {
          kd = Kd();
          return kd.value("nodes", json::array()).size() == n;
        },
        milliseconds(60000)))
        << Diagnostics();
    return kd;
  }
  // After a restart: the same desired count and teachers, the same processes, and no start order
  // in the server's log since `log_before`.
  void ExpectKept(const json& kd, int desired, const std::map<std::string, int>& before,
                  size_t log_before) {
    EXPECT_EQ(kd["desired"], desired) << kd.dump();
    EXPECT_EQ(Placed(kd), Names(before)) << kd.dump();
    EXPECT_TRUE(Placed(kd, /*stopping=*/true).empty()) << kd.dump();
    EXPECT_EQ(TeacherPids(), before) << "a teacher was started again";
    const std::string log = Slurp(dir_.Join("server.log")).substr(log_before);
    EXPECT_EQ(Count(log, "start teacher"), 0u) << "the restarted server ordered a teacher:\n"
                                               << log;
    EXPECT_NE(
        log.find("desired teachers " + std::to_string(desired) + " (kept by the previous server)"),
        std::string::npos)
        << log;
  }
  static std::set<std::string> Names(const std::map<std::string, int>& pids) {
    std::set<std::string> out;
    for (const auto& [name, pid] : pids) out.insert(name);
    return out;
  }

  std::string teachers_;
};

TEST_F(TeacherScalingTest, DesiredCountAndTeachersSurviveAServerSigkill) {
  const std::vector<std::string> state = {"--state_dir", dir_.Join("state")};
  std::unique_ptr<Proc> server = StartServerOn("0", state);
  ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  auto c1 = StartTeacherClient("n1");
  auto c2 = StartTeacherClient("n2");
  KdWithNodes(2);
  // One on each node (the placer spreads a service), both running.
  const std::map<std::string, int> before = ScaleAndWait("2", 2);
  const std::set<std::string> names = Names(before);
  ASSERT_EQ(names.size(), 2u);
  std::string out;

  // n2 is frozen across the restart, so n1 surely re-attaches first.
  std::string n2_teacher;
  for (const json& t : Kd().value("placed", json::array())) {
    if (t["node"] == "n2") n2_teacher = t["name"];
  }
  ASSERT_FALSE(n2_teacher.empty()) << Kd().dump();
  ASSERT_EQ(::kill(c2->pid(), SIGSTOP), 0);
  struct Thaw {
    int pid;
    ~Thaw() { ::kill(pid, SIGCONT); }
  } thaw{c2->pid()};
  const size_t log_before = RestartServer(&server, state, /*cluster=*/false);
  if (HasFailure()) return;
  json kd = KdWithNodes(1);
  ASSERT_EQ(kd["nodes"], json::array({"n1"})) << kd.dump();
  EXPECT_EQ(kd["desired"], 2) << kd.dump();
  EXPECT_EQ(Placed(kd), names) << "n1 got an extra teacher while n2 was away: " << kd.dump();
  for (const json& t : kd["placed"]) {
    EXPECT_EQ(t["awaiting_node"].get<bool>(), t["node"] == "n2") << kd.dump();
  }

  // n2 comes back with its teacher: both kept as they run.
  ASSERT_EQ(::kill(c2->pid(), SIGCONT), 0);
  kd = KdWithNodes(2);
  ExpectKept(kd, 2, before, log_before);
  for (const json& t : kd["placed"]) EXPECT_FALSE(t["awaiting_node"].get<bool>()) << kd.dump();
  for (const auto& [name, pid] : before) EXPECT_EQ(::kill(pid, 0), 0) << name << " no longer runs";
  const std::string log = Slurp(dir_.Join("server.log")).substr(log_before);
  EXPECT_NE(log.find("teacher " + n2_teacher + " placed before the restart runs on node n2; kept"),
            std::string::npos)
      << log;

  // The restarted server goes on scaling the service from there.
  ASSERT_EQ(Ctl({"scale", "--service", "kd", "1"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return Placed(Kd()).size() == 1 && Placed(Kd(), true).empty(); },
                      milliseconds(60000)))
      << Diagnostics();
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server->Wait(milliseconds(30000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(30000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(30000)), 0);
}

TEST_F(TeacherScalingTest, ScalingScriptTakesTheServiceToTwoThenOne) {
  StartServer("0 teachers kd 2\n1 teachers kd 1\n", 1);
  if (HasFatalFailure()) return;
  auto c1 = StartTeacherClient("n1");
  // Both script lines applied: one teacher left running, one started and then stopped.
  json kd;
  ASSERT_TRUE(WaitFor(
      [&] {
        kd = Kd();
        return kd.value("desired", json()) == 1 && Placed(kd).size() == 1 &&
               Placed(kd, true).empty();
      },
      milliseconds(60000)))
      << Diagnostics();
  const std::string log = Slurp(dir_.Join("server.log"));
  EXPECT_EQ(Count(log, "start teacher"), 2u) << log;
  EXPECT_EQ(Count(log, "stop teacher"), 1u) << log;
  EXPECT_NE(log.find("script event: 0.000000 teachers kd 2"), std::string::npos) << log;
  EXPECT_NE(log.find("script event: 1.000000 teachers kd 1"), std::string::npos) << log;
  // The one left is the first started (shrinking stops the newest), and it runs.
  EXPECT_EQ(*Placed(kd).begin(), "n1-t1") << kd.dump();
  ASSERT_TRUE(WaitFor([&] { return TeacherPids().count("n1-t1") > 0; }, milliseconds(30000)))
      << Diagnostics();
  EXPECT_EQ(::kill(TeacherPids()["n1-t1"], 0), 0);
  std::string out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(30000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(30000)), 0);
}

TEST_F(TeacherScalingTest, ClusterServerKeepsTheServiceAndGivesItsSlotsToJobs) {
  const std::vector<std::string> state = {"--state_dir", dir_.Join("state")};
  std::unique_ptr<Proc> server = StartServerOn("0", state, /*cluster=*/true);
  ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  auto c1 = StartTeacherClient("n1", "2", std::string("standin = ") + STAND_IN_TRAINER);
  KdWithNodes(1);
  // Three asked, two trainer slots free: two teachers.
  const std::map<std::string, int> before = ScaleAndWait("3", 2);
  ASSERT_EQ(before.size(), 2u);
  const size_t log_before = RestartServer(&server, state, /*cluster=*/true);
  if (HasFailure()) return;
  std::string out;
  json kd = KdWithNodes(1);
  ExpectKept(kd, 3, before, log_before);

  // A job takes both slots: the teachers give them up (no job was shrunk for them).
  std::ofstream(dir_.Join("j.ini")) << "name = j\ntype = standin\nmin = 1\nmax = 2\n";
  ASSERT_EQ(Ctl({"submit", dir_.Join("j.ini")}, &out), 0) << out;
  ASSERT_TRUE(WaitFor(
      [&] {
        kd = Kd();
        return Placed(kd).empty() && Placed(kd, true).empty();
      },
      milliseconds(60000)))
      << Diagnostics();
  EXPECT_EQ(kd["preempted"], 2) << kd.dump();
  EXPECT_EQ(kd["restarts"], 0) << kd.dump();
  for (const auto& [name, teacher_pid] : before) {
    const int pid = teacher_pid;  // (a structured binding cannot be captured before C++20)
    EXPECT_TRUE(WaitFor([&] { return ::kill(pid, 0) != 0; }, milliseconds(30000)))
        << name << " still runs";
  }
  json jobs;
  ASSERT_TRUE(WaitFor(
      [&] {
        jobs = Jobs();
        return jobs["jobs"].size() == 1 && jobs["jobs"][0].value("trainers", 0) == 2;
      },
      milliseconds(60000)))
      << jobs.dump() << Diagnostics();
  EXPECT_EQ(jobs["jobs"][0]["name"], "j");
  EXPECT_EQ(jobs["jobs"][0]["state"], "running");

  // Cancelled, it gives the slots back: two teachers again.
  ASSERT_EQ(Ctl({"cancel", "j"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return Placed(Kd()).size() == 2 && TeacherPids().size() == 4; },
                      milliseconds(60000)))
      << Diagnostics();
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server->Wait(milliseconds(30000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(30000)), 0);
}

}  // namespace
}  // namespace edl
