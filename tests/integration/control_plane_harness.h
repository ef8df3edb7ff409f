// Helpers shared by the control-plane integration tests: child processes stopped by pid, JSON-lines
// readers, and a fixture that runs a real `edl server`, `edl client`s with the stand-in trainer and
// `edl ctl`. Where each role runs and which addresses it uses are hooks (Wrap, ServerAddrFor,
// AdvertiseAddrFor), so the same scenarios run on loopback and across network namespaces.
//
// Thread-safety: none; one test thread.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl::itest {

using nlohmann::json;
using std::chrono::milliseconds;

class ControlPlaneHarness : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_ = dir_.Join("secret");
    itest::WriteSecretFile(secret_, "integration-test-secret-0123456789");
    records_ = dir_.Join("records.jsonl");
  }

  // ---- placement hooks (loopback by default)
  // argv prefix that runs a role ("server", "ctl" or a client's node name) where it belongs.
  virtual std::vector<std::string> Wrap(const std::string& role) { return {}; }
  virtual std::string ServerBind() { return "127.0.0.1"; }
  // Address of the server as seen from `role`.
  virtual std::string ServerAddrFor(const std::string& role) { return "127.0.0.1"; }
  // The address a client's node advertises.
  virtual std::string AdvertiseAddrFor(const std::string& node) { return "127.0.0.1"; }

  std::vector<std::string> Wrapped(const std::string& role, std::vector<std::string> argv) {
    std::vector<std::string> out = Wrap(role);
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  void StartServer(const std::string& script, int trainers,
                   const std::vector<std::string>& extra = {}) {
    std::ofstream(dir_.Join("scale.script")) << script;
    std::vector<std::string> argv = {test::EdlBinary(),
                                     "server",
                                     "--server_port",
                                     "0",
                                     "--bind",
                                     ServerBind(),
                                     "--port_file",
                                     dir_.Join("port"),
                                     "--secret_file",
                                     secret_,
                                     "--job_id",
                                     "itest",
                                     "--min_trainers",
                                     "1",
                                     "--trainers",
                                     std::to_string(trainers),
                                     "--scale_script",
                                     dir_.Join("scale.script"),
                                     "--events_dir",
                                     dir_.Join("events"),
                                     "--heartbeat_timeout_ms",
                                     "3000",
                                     "--join_timeout_s",
                                     "20"};
    // A flag of `extra` replaces its default (the server refuses a flag given twice).
    for (const std::string& flag : extra) {
      auto d = std::find(argv.begin() + 2, argv.end(), flag);
      if (flag.rfind("--", 0) == 0 && d != argv.end()) argv.erase(d, d + 2);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    server_ = std::make_unique<Proc>(Wrapped("server", argv), dir_.Join("server.log"));
    port_ = WaitForPortFile(dir_.Join("port"), server_.get());
    ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  }

  // `flags` override the defaults below or add to them ("" as a value: a switch such as
  // --exit_when_done); `env` goes to the client and so to its stand-in trainers.
  std::unique_ptr<Proc> StartClient(const std::string& node, const std::string& mode,
                                    const std::string& secret_file = "",
                                    const std::map<std::string, std::string>& flags = {},
                                    std::map<std::string, std::string> env = {}) {
    std::map<std::string, std::string> f = {
        {"server", ServerAddrFor(node) + ":" + port_},
        {"secret_file", secret_file.empty() ? secret_ : secret_file},
        {"node_name", node},
        {"slots", "2"},
        {"mode", mode},
        {"advertise_addr", AdvertiseAddrFor(node)},
        {"socket_path", dir_.Join(node + ".sock")},
        {"log_dir", dir_.Join("logs")},
        {"leave_grace_s", "5"},
        {"stop_grace_s", "2"},
        {"trainer_timeout_s", "10"}};
    for (const auto& [k, v] : flags) f[k] = v;
    std::vector<std::string> argv = {test::EdlBinary(), "client"};
    for (const auto& [k, v] : f) {
      argv.push_back("--" + k);
      if (!v.empty()) argv.push_back(v);
    }
    argv.push_back("--");
    argv.push_back(STAND_IN_TRAINER);
    env["STANDIN_RECORD"] = records_;
    if (mode == "restart") env["STANDIN_MODE"] = "restart";
    return std::make_unique<Proc>(Wrapped(node, argv), dir_.Join(node + ".log"), env);
  }

  std::vector<std::string> CtlArgv(const std::vector<std::string>& args,
                                   const std::string& secret = "") {
    std::vector<std::string> argv = {test::EdlBinary(), "ctl",
                                     "--server",        ServerAddrFor("ctl") + ":" + port_,
                                     "--secret_file",   secret.empty() ? secret_ : secret};
    argv.insert(argv.end(), args.begin(), args.end());
    return Wrapped("ctl", argv);
  }

  int Ctl(const std::vector<std::string>& args, std::string* out, const std::string& secret = "") {
    const std::string log = dir_.Join("ctl.out");
    std::remove(log.c_str());
    Proc p(CtlArgv(args, secret), log);
    const int rc = p.Wait(milliseconds(20000));
    *out = Slurp(log);
    return rc;
  }

  // `edl ctl jobs --json` of a cluster server (its "jobs" empty when the reply is not JSON).
  json Jobs() {
    std::string out;
    EXPECT_EQ(Ctl({"jobs", "--json"}, &out), 0) << out;
    const size_t brace = out.find('{');
    json j = json::parse(brace == std::string::npos ? "" : out.substr(brace), nullptr, false);
    return j.is_object() ? j : json{{"jobs", json::array()}, {"unparsed", out}};
  }

  std::vector<json> Events() { return ReadLines(dir_.Join("events/itest.events.jsonl")); }

  // ---- a cluster server's jobs (`--cluster`: one events log per job)
  std::vector<json> JobEvents(const std::string& job) {
    return ReadLines(dir_.Join("events/" + job + ".events.jsonl"));
  }
  int64_t LastGeneration(const std::string& job) {
    int64_t g = 0;
    for (const json& e : JobEvents(job)) {
      if (e.value("type", "") == "generation") g = e["generation"].get<int64_t>();
    }
    return g;
  }
  int CountJobEvents(const std::string& job, const std::string& type) {
    int n = 0;
    for (const json& e : JobEvents(job)) n += e.value("type", "") == type;
    return n;
  }
  // Trainers of `job` that finished a KV round in generation `g`.
  std::set<std::string> KvDone(const std::string& job, int64_t g) {
    std::set<std::string> out;
    for (const json& r : ReadLines(records_)) {
      if (r["event"] == "kv" && r["generation"] == g && r["ok"] == true &&
          r.value("job_id", "") == job) {
        out.insert(r["trainer_id"].get<std::string>());
      }
    }
    return out;
  }
  // A warm spare's own records, before it became a trainer (it is no trainer yet).
  static bool IsSpareRecord(const json& r) {
    const std::string e = r.value("event", "");
    return e == "spare" || e == "spare_released";
  }
  // Every pid that wrote a record for each trainer id (spares' own records left out).
  std::map<std::string, std::set<int>> Pids() {
    std::map<std::string, std::set<int>> out;
    for (const json& r : ReadLines(records_)) {
      if (!IsSpareRecord(r)) out[r["trainer_id"]].insert(r["pid"].get<int>());
    }
    return out;
  }

  std::vector<json> Generations() {
    std::vector<json> out;
    for (const json& e : Events()) {
      if (e["type"] == "generation") out.push_back(e);
    }
    return out;
  }

  // Number of the first generation record matching `pred` (0 when none).
  int64_t FirstGeneration(const std::function<bool(const json&)>& pred) {
    for (const json& g : Generations()) {
      if (pred(g)) return g["generation"].get<int64_t>();
    }
    return 0;
  }

  // Stand-in trainers that finished a KV round in `generation`.
  int KvRounds(int64_t generation) {
    int n = 0;
    for (const json& r : ReadLines(records_)) {
      n += r["event"] == "kv" && r["generation"] == generation && r["ok"] == true;
    }
    return n;
  }

  // Waits for the first failure generation that leaves `world` members, then for every one of them
  // to finish a KV round in it (they re-formed and go on): its number, or 0 when none came, and
  // in *reformed whether they did.
  int64_t WaitForFailureAndReform(int world, bool* reformed) {
    int64_t failed = 0;
    const bool came = WaitFor(
        [&] {
          failed = FirstGeneration([&](const json& g) {
            return g["failure"] == true && g["world_size_after"] == world;
          });
          return failed > 0;
        },
        milliseconds(60000));
    *reformed = came && WaitFor([&] { return KvRounds(failed) == world; }, milliseconds(30000));
    return came ? failed : 0;
  }

  // Waits until the events log holds a generation record matching `pred`.
  bool WaitForGeneration(const std::function<bool(const json&)>& pred, milliseconds timeout) {
    return WaitFor(
        [&] {
          for (const json& g : Generations()) {
            if (pred(g)) return true;
          }
          return false;
        },
        timeout);
  }

  std::string Diagnostics() {
    return "\n--- events\n" + Slurp(dir_.Join("events/itest.events.jsonl")) + "\n--- records\n" +
           Slurp(records_) + "\n--- server\n" + Slurp(dir_.Join("server.log")).substr(0, 20000);
  }

  // The in-place scenario shared by the loopback and network-namespace tests: nodes n1 and n2 with
  // 2 slots each; 4 trainers at start, 2 at t=3 s, 3 at t=6 s (one hot joiner), one SIGKILLed at
  // t=10 s and grown back to 3. Asserts from the events log, `edl ctl status` and the stand-ins'
  // own records; then stops the job with `edl ctl stop`. `check_start` sees each start record.
  void RunInPlaceFourTwoThreeAndKill(
      const std::function<void(const json&)>& check_start = nullptr) {
    StartServer("0 set 4\n3 set 2\n6 set 3\n10 kill 1\n", 4);
    if (HasFatalFailure()) return;
    auto c1 = StartClient("n1", "inplace");
    auto c2 = StartClient("n2", "inplace");
    ASSERT_TRUE(WaitForGeneration(
        [](const json& g) { return g["reason"] == "grow_back" && g["world_size_after"] == 3; },
        milliseconds(60000)))
        << Diagnostics();
    // Every member of the grown-back generation (the joiner included) finished its KV round there.
    int64_t grown = 0;
    for (const json& g : Generations()) {
      if (g["reason"] == "grow_back") grown = g["generation"].get<int64_t>();
    }
    ASSERT_TRUE(WaitFor(
        [&] {
          int done = 0;
          for (const json& r : ReadLines(records_))
            done += r["event"] == "kv" && r["generation"] == grown;
          return done >= 3;
        },
        milliseconds(60000)))
        << Diagnostics();
    std::string out;
    ASSERT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
    json st = json::parse(out.substr(out.find('{')), nullptr, false);
    ASSERT_FALSE(st.is_discarded()) << out;
    EXPECT_EQ(st["world_size"], 3);
    EXPECT_EQ(st["total_slots"], 4);
    for (const json& n : st["nodes"])
      EXPECT_EQ(n["host"], AdvertiseAddrFor(n["name"].get<std::string>())) << n.dump();
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
    std::map<std::string, json> start_of;          // trainer id -> start record
    std::map<std::string, std::set<int>> pids_of;  // trainer id -> every pid that wrote for it
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
      if (check_start) check_start(s);
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

  test::ScratchDir dir_{"edl-cp"};
  std::string secret_, records_, port_;
  std::unique_ptr<Proc> server_;
};

}  // namespace edl::itest
