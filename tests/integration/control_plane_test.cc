// Control-plane integration: a real `edl server`, two `edl client` processes on loopback and the
// stand-in trainer. Assertions come from the stand-ins' own records (pid, env, generations seen)
// and the server's events log.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "edl/net/framed_socket.h"
#include "tests/testutil.h"

namespace edl {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// One child process, stopped by pid (SIGTERM, then SIGKILL) when the object goes away.
class Proc {
 public:
  Proc(std::vector<std::string> argv, const std::string& log, std::map<std::string, std::string> env = {}) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      FILE* f = std::fopen(log.c_str(), "a");
      if (f) {
        ::dup2(fileno(f), 1);
        ::dup2(fileno(f), 2);
      }
      for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Proc() { Stop(); }
  // Waits up to `timeout` for the exit; returns the exit code, or -1 on timeout, 128+sig if signalled.
  int Wait(milliseconds timeout) {
    if (done_) return code_;
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        done_ = true;
        code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return code_;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return -1;
  }
  void Stop() {
    if (done_ || pid_ <= 0) return;
    ::kill(-pid_, SIGTERM);
    if (Wait(milliseconds(5000)) < 0) {
      ::kill(-pid_, SIGKILL);
      Wait(milliseconds(5000));
    }
  }
  int pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  int code_ = -1;
};

std::vector<json> ReadLines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_ = dir_.Join("secret");
    std::ofstream(secret_) << "integration-test-secret-0123456789\n";
    records_ = dir_.Join("records.jsonl");
  }

  void StartServer(const std::string& script, int trainers, const std::string& extra_flag = "") {
    std::ofstream(dir_.Join("scale.script")) << script;
    std::vector<std::string> argv = {test::EdlBinary(), "server", "--server_port", "0", "--bind", "127.0.0.1",
                                     "--port_file", dir_.Join("port"), "--secret_file", secret_,
                                     "--job_id", "itest", "--min_trainers", "1",
                                     "--trainers", std::to_string(trainers), "--scale_script",
                                     dir_.Join("scale.script"), "--events_dir", dir_.Join("events"),
                                     "--heartbeat_timeout_ms", "3000", "--join_timeout_s", "20"};
    if (!extra_flag.empty()) argv.push_back(extra_flag);
    server_ = std::make_unique<Proc>(argv, dir_.Join("server.log"));
    for (int i = 0; i < 500 && port_.empty(); ++i) {
      std::this_thread::sleep_for(milliseconds(20));
      std::string p = Slurp(dir_.Join("port"));
      if (!p.empty() && p.back() == '\n') port_ = p.substr(0, p.size() - 1);
    }
    ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  }

  std::unique_ptr<Proc> StartClient(const std::string& node, const std::string& mode,
                                    const std::string& secret_file = "") {
    std::vector<std::string> argv = {test::EdlBinary(), "client", "--server", "127.0.0.1:" + port_,
                                     "--secret_file", secret_file.empty() ? secret_ : secret_file,
                                     "--node_name", node, "--slots", "2", "--mode", mode,
                                     "--socket_path", dir_.Join(node + ".sock"), "--log_dir",
                                     dir_.Join("logs"), "--leave_grace_s", "5", "--stop_grace_s", "2",
                                     "--trainer_timeout_s", "10", "--", STAND_IN_TRAINER};
    std::map<std::string, std::string> env = {{"STANDIN_RECORD", records_}};
    if (mode == "restart") env["STANDIN_MODE"] = "restart";
    return std::make_unique<Proc>(argv, dir_.Join(node + ".log"), env);
  }

  int Ctl(const std::vector<std::string>& args, std::string* out, const std::string& secret = "") {
    std::vector<std::string> argv = {test::EdlBinary(), "ctl", "--server", "127.0.0.1:" + port_,
                                     "--secret_file", secret.empty() ? secret_ : secret};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = dir_.Join("ctl.out");
    std::remove(log.c_str());
    Proc p(argv, log);
    const int rc = p.Wait(milliseconds(20000));
    *out = Slurp(log);
    return rc;
  }

  std::vector<json> Generations() {
    std::vector<json> out;
    for (const json& e : ReadLines(dir_.Join("events/itest.events.jsonl"))) {
      if (e["type"] == "generation") out.push_back(e);
    }
    return out;
  }

  // Waits until the events log holds a generation record matching `pred`.
  bool WaitForGeneration(const std::function<bool(const json&)>& pred, milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      for (const json& g : Generations()) {
        if (pred(g)) return true;
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    return false;
  }

  std::string Diagnostics() {
    return "\n--- events\n" + Slurp(dir_.Join("events/itest.events.jsonl")) + "\n--- records\n" +
           Slurp(records_) + "\n--- server\n" + Slurp(dir_.Join("server.log")).substr(0, 20000);
  }

  test::ScratchDir dir_{"edl-cp"};
  std::string secret_, records_, port_;
  std::unique_ptr<Proc> server_;
};

TEST_F(ControlPlaneTest, InPlaceScriptFourTwoThreeAndKill) {
  // 4 at start; 2 at t=3 s; 3 at t=6 s (one hot joiner); at t=10 s one trainer is SIGKILLed and
  // the job grows back to 3.
  StartServer("0 set 4\n3 set 2\n6 set 3\n10 kill 1\n", 4);
  auto c1 = StartClient("n1", "inplace");
  auto c2 = StartClient("n2", "inplace");
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["reason"] == "grow_back" && g["world_size_after"] == 3; },
                                milliseconds(60000)))
      << Diagnostics();
  std::this_thread::sleep_for(milliseconds(1500));  // let the grown-back trainer record its view
  std::string out;
  ASSERT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
  json st = json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_FALSE(st.is_discarded()) << out;
  EXPECT_EQ(st["world_size"], 3);
  EXPECT_EQ(st["total_slots"], 4);
  ASSERT_EQ(Ctl({"status"}, &out), 0);
  EXPECT_NE(out.find("RUNNING-TRAINERS"), std::string::npos) << out;
  EXPECT_NE(out.find("itest:3"), std::string::npos) << out;

  // The generation sequence from the events log.
  std::vector<json> gens = Generations();
  ASSERT_GE(gens.size(), 5u) << Diagnostics();
  EXPECT_EQ(gens[0]["reason"], "start");
  EXPECT_EQ(gens[0]["world_size_after"], 4);
  EXPECT_EQ(gens[1]["reason"], "script");
  EXPECT_EQ(gens[1]["world_size_after"], 2);
  EXPECT_EQ(gens[2]["reason"], "script");
  EXPECT_EQ(gens[2]["world_size_after"], 3);
  EXPECT_EQ(gens[3]["reason"], "failure");
  EXPECT_EQ(gens[3]["failure"], true);
  EXPECT_EQ(gens[3]["world_size_after"], 2);

  // The stand-ins' own records.
  std::map<std::string, json> start_of;        // trainer id -> start record
  std::map<std::string, std::set<int>> pids_of; // trainer id -> every pid that wrote for it
  std::set<std::string> left, kv_failed;
  for (const json& r : ReadLines(records_)) {
    const std::string id = r["trainer_id"];
    pids_of[id].insert(r["pid"].get<int>());
    if (r["event"] == "start") start_of[id] = r;
    if (r["event"] == "leave") left.insert(id);
    if (r["event"] == "kv" && !r["ok"].get<bool>()) kv_failed.insert(id);
  }
  int first_gen = 0, joiners = 0;
  for (auto& [id, s] : start_of) {
    EXPECT_EQ(pids_of[id].size(), 1u) << id << " changed pid";  // in place: never restarted
    if (s["generation"] == 1) {
      ++first_gen;
      EXPECT_EQ(s["world_size"], 4);
      EXPECT_FALSE(s["joining"].get<bool>());
    } else {
      ++joiners;
      EXPECT_TRUE(s["joining"].get<bool>()) << s.dump();
    }
  }
  EXPECT_EQ(first_gen, 4);
  EXPECT_EQ(joiners, 2);  // one for 2 -> 3, one growing back after the kill
  EXPECT_EQ(left.size(), 2u) << "the two trainers removed by 4 -> 2 exit 0 by themselves";
  EXPECT_TRUE(kv_failed.empty()) << Diagnostics();

  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(10000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);
}

TEST_F(ControlPlaneTest, RestartModeRestartsEveryTrainerWithNewEnv) {
  StartServer("0 set 4\n3 set 2\n6 set 3\n", 4);
  auto c1 = StartClient("n1", "restart");
  auto c2 = StartClient("n2", "restart");
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["generation"] == 3; }, milliseconds(60000)))
      << Diagnostics();
  std::this_thread::sleep_for(milliseconds(3000));  // replacements start once their slot is free
  std::map<int64_t, std::vector<json>> starts;  // generation -> start records
  std::set<int> terminated;
  for (const json& r : ReadLines(records_)) {
    if (r["event"] == "start") starts[r["generation"].get<int64_t>()].push_back(r);
    if (r["event"] == "term") terminated.insert(r["pid"].get<int>());
  }
  const std::map<int64_t, int> want = {{1, 4}, {2, 2}, {3, 3}};
  for (auto [gen, world] : want) {
    ASSERT_EQ(starts[gen].size(), static_cast<size_t>(world)) << "generation " << gen << Diagnostics();
    std::set<int> ranks;
    for (const json& s : starts[gen]) {
      EXPECT_EQ(s["world_size"], world);
      ranks.insert(s["rank"].get<int>());
      if (gen < 3) {
        EXPECT_TRUE(terminated.count(s["pid"].get<int>())) << "not restarted: " << s.dump();
      }
    }
    EXPECT_EQ(ranks.size(), static_cast<size_t>(world));
    EXPECT_EQ(*ranks.rbegin(), world - 1);
  }
  std::string out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);
}

TEST_F(ControlPlaneTest, UnauthenticatedPeersAreRefusedAndTheServerKeepsServing) {
  StartServer("", 1);
  std::ofstream(dir_.Join("wrong")) << "a-different-secret-of-enough-length\n";
  // A client with the wrong secret is refused and exits 2 without starting trainers.
  auto bad = StartClient("intruder", "inplace", dir_.Join("wrong"));
  EXPECT_EQ(bad->Wait(milliseconds(15000)), 2);
  EXPECT_NE(Slurp(dir_.Join("intruder.log")).find("Unauthenticated"), std::string::npos);
  std::string out;
  EXPECT_EQ(Ctl({"scale", "3"}, &out, dir_.Join("wrong")), 1);
  EXPECT_NE(out.find("Unauthenticated"), std::string::npos) << out;
  // Raw garbage, an oversize header, and a frame before hello: each connection is dropped.
  std::string host = "127.0.0.1";
  for (int kind = 0; kind < 3; ++kind) {
    auto s = net::FramedSocket::ConnectTcp(host, std::stoi(port_), milliseconds(2000));
    ASSERT_OK(s.status());
    json m;
    ASSERT_OK(s.value()->Receive(&m, milliseconds(2000)));  // the challenge
    if (kind == 0) {
      ASSERT_OK(s.value()->Send(json{{"type", "ctl"}, {"command", "stop"}}, milliseconds(2000)));
    } else {
      ASSERT_OK(s.value()->Send(json{{"type", "hello"}, {"role", "ctl"}, {"mac", std::string(64, '0')},
                                     {"nonce", std::string(64, '1')}},
                                milliseconds(2000)));
    }
    Status st = s.value()->Receive(&m, milliseconds(5000));
    if (st.ok()) {
      EXPECT_EQ(m["type"], "error") << m.dump();
    }
  }
  // The server still serves an authenticated ctl, and no trainer was started by anybody.
  ASSERT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
  EXPECT_NE(out.find("\"world_size\": 0"), std::string::npos) << out;
  EXPECT_EQ(Slurp(records_), "");
}

TEST_F(ControlPlaneTest, SecondClientWithTheSameNodeNameIsRefused) {
  StartServer("", 2);
  auto c1 = StartClient("same", "inplace");
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["generation"] == 1; }, milliseconds(20000)))
      << Diagnostics();
  std::vector<std::string> argv = {test::EdlBinary(), "client", "--server", "127.0.0.1:" + port_,
                                   "--secret_file", secret_, "--node_name", "same", "--slots", "2",
                                   "--socket_path", dir_.Join("dup.sock"), "--", STAND_IN_TRAINER};
  Proc dup(argv, dir_.Join("dup.log"));
  EXPECT_EQ(dup.Wait(milliseconds(15000)), 2);
  EXPECT_NE(Slurp(dir_.Join("dup.log")).find("already connected"), std::string::npos);
  std::string out;
  ASSERT_EQ(Ctl({"status", "--json"}, &out), 0);
  EXPECT_NE(out.find("\"world_size\": 2"), std::string::npos) << out;
}

}  // namespace
}  // namespace edl
