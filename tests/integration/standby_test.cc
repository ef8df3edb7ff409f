// A standby takes over (jobserver/state/STATE.md "Standby servers"): a real etcd started by the
// test, two real `edl server --state_store etcd://...` on one job, two `edl client`s with stand-in
// trainers and `edl ctl` given both servers.
//  - one server leads and listens, the other waits without listening;
//  - the leader SIGKILLed: the standby takes over, resumes the job from etcd, adopts the running
//    trainers (same pids), and the next change is numbered above every earlier generation; a
//    teacher service scaled to 1 keeps its desired count and its one teacher (same process);
//  - a leader paused (SIGSTOP) past its lease is replaced and, once resumed, stops with exit 1;
//  - fencing: a backend whose leader key was replaced cannot write, and one whose lease was revoked
//    reports the loss;
//  - a cluster server (`--cluster`) the same way: two running jobs and a pending one survive the
//    leader's SIGKILL on the standby, with their placement, generation numbers and trainers;
//  - a standby pointed at an etcd that holds another server's state refuses it, naming the fix.
// Skipped, with the reason printed, where etcd is not installed (Debian: etcd-server).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "jobserver/state/etcd_client.h"
#include "jobserver/state/etcd_state.h"
#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using itest::FreePort;
using itest::json;
using itest::milliseconds;
using itest::Proc;
using itest::ReadLines;
using itest::Slurp;
using itest::WaitFor;
using jobserver::EtcdClient;
using jobserver::EtcdKv;

std::string FindEtcd() {
  for (const char* d : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    const std::string p = std::string(d) + "/etcd";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

bool Listens(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

class StandbyTest : public itest::ControlPlaneHarness {
 protected:
  void SetUp() override {
    ControlPlaneHarness::SetUp();
    const std::string etcd = FindEtcd();
    if (etcd.empty()) {
      GTEST_SKIP()
          << "etcd is not installed (Debian: apt-get install etcd-server; scripts/install_deps.sh "
             "installs it with the test dependencies)";
    }
    const int client_port = FreePort(), peer_port = FreePort();
    etcd_url_ = "http://127.0.0.1:" + std::to_string(client_port);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port);
    etcd_ = std::make_unique<Proc>(
        std::vector<std::string>{
            etcd, "--name", "edl-test", "--data-dir", dir_.Join("etcd"), "--listen-client-urls",
            etcd_url_, "--advertise-client-urls", etcd_url_, "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url, "--initial-cluster", "edl-test=" + peer_url},
        dir_.Join("etcd.log"));
    // etcd shuts down on SIGTERM and then re-raises it (Go's osutil.HandleInterrupts): it dies of
    // it.
    etcd_->ExpectExit(128 + SIGTERM);
    jobserver::EtcdClientOptions o;
    o.endpoints = {{"127.0.0.1", client_port}};
    client_ = std::make_unique<EtcdClient>(o);
    store_ = "etcd://127.0.0.1:" + std::to_string(client_port);
    std::vector<EtcdKv> kvs;
    ASSERT_TRUE(
        WaitFor([&] { return client_->Range("probe", "", &kvs).ok(); }, milliseconds(30000)))
        << Slurp(dir_.Join("etcd.log"), 4000);
  }

  void TearDown() override {
    servers_.clear();
    if (etcd_) etcd_->Stop();
  }

  // `cluster`: a cluster server (`--cluster`) instead of a one-job server of 4 trainers.
  std::unique_ptr<Proc> StartEtcdServer(const std::string& name, int port, bool cluster = false,
                                        const std::string& id = "itest") {
    std::vector<std::string> argv = {test::EdlBinary(),
                                     "server",
                                     "--server_port",
                                     std::to_string(port),
                                     "--bind",
                                     "127.0.0.1",
                                     "--port_file",
                                     dir_.Join(name + ".port"),
                                     "--secret_file",
                                     secret_,
                                     "--job_id",
                                     id,
                                     "--events_dir",
                                     dir_.Join("events"),
                                     "--heartbeat_timeout_ms",
                                     "3000",
                                     "--join_timeout_s",
                                     "60",
                                     "--backoff_min_s",
                                     "0",
                                     "--backoff_max_s",
                                     "0",
                                     "--state_store",
                                     store_,
                                     "--lease_ttl_s",
                                     "2"};
    if (cluster) {
      argv.push_back("--cluster");
    } else {
      for (const char* a : {"--min_trainers", "1", "--trainers", "4"}) argv.push_back(a);
    }
    return std::make_unique<Proc>(argv, dir_.Join(name + ".log"));
  }

  // SIGKILLs leader a and waits until standby b listens; prints how long that took (`what`).
  void KillLeaderUntilTheStandbyListens(const char* what) {
    ASSERT_EQ(::kill(servers_[0]->pid(), SIGKILL), 0);
    ASSERT_EQ(servers_[0]->Wait(milliseconds(10000)), 128 + SIGKILL);
    const auto killed = std::chrono::steady_clock::now();
    ASSERT_FALSE(itest::WaitForPortFile(dir_.Join("b.port"), servers_[1].get()).empty()) << Logs();
    const auto took =
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - killed);
    std::printf("%s: b listens %lld ms after a's SIGKILL (lease TTL 2 s; load %s)\n", what,
                static_cast<long long>(took.count()), Slurp("/proc/loadavg").substr(0, 14).c_str());
  }

  std::string LeaderValue() {
    std::vector<EtcdKv> kvs;
    Status s = client_->Range(jobserver::EtcdLeaderKey("itest"), "", &kvs);
    return s.ok() && !kvs.empty() ? kvs[0].value : "";
  }

  bool HasEvent(const std::string& type) {
    for (const json& e : Events()) {
      if (e["type"] == type) return true;
    }
    return false;
  }

  int KvRounds(int64_t generation) {
    int n = 0;
    for (const json& r : ReadLines(records_))
      n += r["event"] == "kv" && r["generation"] == generation && r["ok"] == true;
    return n;
  }

  json CtlStatus() {
    std::string out;
    EXPECT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
    const size_t brace = out.find('{');
    return brace == std::string::npos ? json() : json::parse(out.substr(brace), nullptr, false);
  }

  std::string Logs() {
    return Diagnostics() + "\n--- a\n" + Slurp(dir_.Join("a.log"), 8000) + "\n--- b\n" +
           Slurp(dir_.Join("b.log"), 8000);
  }

  std::string etcd_url_, store_;
  std::unique_ptr<Proc> etcd_;
  std::unique_ptr<EtcdClient> client_;
  std::vector<std::unique_ptr<Proc>> servers_;
};

TEST_F(StandbyTest, TheStandbyTakesOverAfterTheLeaderIsKilledAndAdoptsTheTrainers) {
  const int port_a = FreePort(), port_b = FreePort();
  servers_.push_back(StartEtcdServer("a", port_a));
  ASSERT_FALSE(itest::WaitForPortFile(dir_.Join("a.port"), servers_[0].get()).empty()) << Logs();
  servers_.push_back(StartEtcdServer("b", port_b));
  // b waits as a standby: it names the leader and does not listen.
  ASSERT_TRUE(WaitFor(
      [&] {
        return Slurp(dir_.Join("b.log")).find("standby for job itest: the leader is") !=
               std::string::npos;
      },
      milliseconds(30000)))
      << Logs();
  EXPECT_FALSE(Listens(port_b));
  EXPECT_NE(LeaderValue().find(std::to_string(port_a)), std::string::npos) << LeaderValue();

  // Clients and ctl get both servers ("127.0.0.1:a,127.0.0.1:b" through the harness's port_).
  port_ = std::to_string(port_a) + ",127.0.0.1:" + std::to_string(port_b);
  // n1 also offers teacher service kd; its stand-in teacher records "PID ARGS" and runs until its
  // client is gone.
  const std::string teachers = dir_.Join("teachers.txt");
  std::ofstream(dir_.Join("teacher.sh"))
      << "echo \"$$ $*\" >> " << teachers << "\ntrap 'exit 0' TERM\n"
      << "while kill -0 $PPID 2>/dev/null; do sleep 0.2; done\n";
  auto c1 =
      StartClient("n1", "inplace", "", {{"service", "kd = /bin/sh " + dir_.Join("teacher.sh")}});
  auto c2 = StartClient("n2", "inplace");
  ASSERT_TRUE(WaitFor([&] { return KvRounds(1) == 4; }, milliseconds(60000))) << Logs();
  std::string out;
  ASSERT_EQ(Ctl({"scale", "--service", "kd", "1"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return !Slurp(teachers).empty(); }, milliseconds(60000))) << Logs();
  const std::string teacher_line =
      Slurp(teachers);  // "PID /path/teacher.sh --service kd --name n1-t1 ..."
  EXPECT_NE(teacher_line.find("--name n1-t1 "), std::string::npos) << teacher_line;
  json st = CtlStatus();
  ASSERT_TRUE(st.is_object()) << Logs();
  EXPECT_EQ(st["generation"], 1);
  EXPECT_EQ(st["world_size"], 4);
  std::map<std::string, std::set<int>> pids_before;
  for (const json& r : ReadLines(records_)) {
    if (!IsSpareRecord(r)) pids_before[r["trainer_id"]].insert(r["pid"].get<int>());
  }
  ASSERT_EQ(pids_before.size(), 4u) << Logs();

  KillLeaderUntilTheStandbyListens("takeover");
  EXPECT_NE(Slurp(dir_.Join("b.log")).find("resuming job itest from --state_store " + store_),
            std::string::npos)
      << Logs();
  EXPECT_NE(LeaderValue().find(std::to_string(port_b)), std::string::npos) << LeaderValue();

  // The new leader adopts the four trainers of generation 1 as their clients re-attach.
  ASSERT_TRUE(WaitFor([&] { return HasEvent("recovered"); }, milliseconds(60000))) << Logs();
  st = CtlStatus();
  ASSERT_TRUE(st.is_object()) << Logs();
  EXPECT_EQ(st["generation"], 1);
  EXPECT_EQ(st["world_size"], 4);
  // The service: the same desired count and teacher (kept in etcd), no start by the new leader.
  const json kd = st["services"]["kd"];
  EXPECT_EQ(kd["desired"], 1) << kd.dump();
  ASSERT_EQ(kd["placed"].size(), 1u) << kd.dump();
  EXPECT_EQ(kd["placed"][0]["name"], "n1-t1") << kd.dump();
  EXPECT_EQ(Slurp(teachers), teacher_line) << "a teacher was started again";
  EXPECT_EQ(::kill(std::stoi(teacher_line), 0), 0) << "the teacher no longer runs";
  EXPECT_EQ(Slurp(dir_.Join("b.log")).find("start teacher"), std::string::npos) << Logs();

  // The next change is numbered above generation 1 and reaches the same trainers.
  ASSERT_EQ(Ctl({"scale", "3"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return KvRounds(2) == 3; }, milliseconds(60000))) << Logs();
  std::map<std::string, std::set<int>> pids_after;
  for (const json& r : ReadLines(records_)) {
    if (!IsSpareRecord(r)) pids_after[r["trainer_id"]].insert(r["pid"].get<int>());
  }
  EXPECT_EQ(pids_after, pids_before) << "a trainer was restarted or added" << Logs();
  for (const json& g : Generations()) EXPECT_FALSE(g["failure"].get<bool>()) << g.dump() << Logs();

  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(servers_[1]->Wait(milliseconds(10000)), 0) << Logs();
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);
  // A clean stop resigns: the leader key is gone at once, not after the TTL.
  EXPECT_EQ(LeaderValue(), "");
}

// The cluster server survives its machine: the leader of a cluster (two running jobs, one pending)
// is SIGKILLed and a standby on another port takes over from etcd with every job, its placement,
// its generation numbers and its running trainers (no pid changes, no generation made by the
// takeover); the pending job is still pending, and the next change is numbered above the old ones.
TEST_F(StandbyTest, AClusterServerIsTakenOverWithEveryJobAndItsTrainers) {
  const int port_a = FreePort(), port_b = FreePort();
  servers_.push_back(StartEtcdServer("a", port_a, /*cluster=*/true));
  ASSERT_FALSE(itest::WaitForPortFile(dir_.Join("a.port"), servers_[0].get()).empty()) << Logs();
  servers_.push_back(StartEtcdServer("b", port_b, /*cluster=*/true));
  ASSERT_TRUE(WaitFor(
      [&] {
        return Slurp(dir_.Join("b.log")).find("standby for job itest: the leader is") !=
               std::string::npos;
      },
      milliseconds(30000)))
      << Logs();
  EXPECT_FALSE(Listens(port_b));
  port_ = std::to_string(port_a) + ",127.0.0.1:" + std::to_string(port_b);
  auto client = [&](const std::string& node) {
    return StartClient(node, "inplace", "",
                       {{"job_type", std::string("standin = ") + STAND_IN_TRAINER}});
  };
  auto c1 = client("n1");
  auto c2 = client("n2");
  ASSERT_TRUE(WaitFor(
      [&] { return Slurp(dir_.Join("a.log")).find("node n2 registered") != std::string::npos; },
      milliseconds(30000)))
      << Logs();
  auto submit = [&](const std::string& name, int min, int max) {
    const std::string path = dir_.Join(name + ".ini");
    std::ofstream(path) << "name = " << name << "\ntype = standin\nmin = " << min
                        << "\nmax = " << max << "\n";
    std::string out;
    ASSERT_EQ(Ctl({"submit", path}, &out), 0) << out;
  };
  submit("ja", 1, 2);
  submit("jb", 1, 2);
  submit("jc", 3,
         3);  // 4 slots, 2 each for ja and jb: jc cannot start, and shrinking them would not fit it
  std::map<std::string, int64_t> gen;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const std::string job : {"ja", "jb"}) {
          gen[job] = LastGeneration(job);
          if (gen[job] == 0 || KvDone(job, gen[job]).size() < 2) return false;
        }
        return true;
      },
      milliseconds(60000)))
      << Logs();
  auto state_of = [](const json& jobs, const std::string& name) {
    for (const json& j : jobs["jobs"]) {
      if (j["name"] == name) return j;
    }
    return json();
  };
  const json before = Jobs();
  ASSERT_EQ(before["jobs"].size(), 3u) << before.dump();
  EXPECT_EQ(state_of(before, "jc")["state"], "pending") << before.dump();
  const auto pids_before = Pids();
  ASSERT_EQ(pids_before.size(), 4u) << Logs();

  KillLeaderUntilTheStandbyListens("cluster takeover");
  EXPECT_NE(Slurp(dir_.Join("b.log")).find("resuming the cluster from --state_store " + store_),
            std::string::npos)
      << Logs();
  // Each running job adopts its two trainers as their clients re-attach to b.
  ASSERT_TRUE(WaitFor(
      [&] { return CountJobEvents("ja", "recovered") + CountJobEvents("jb", "recovered") == 2; },
      milliseconds(60000)))
      << Logs();
  const json after = Jobs();
  ASSERT_EQ(after["jobs"].size(), 3u) << after.dump();
  for (const std::string job : {"ja", "jb"}) {
    EXPECT_EQ(state_of(after, job)["state"], "running") << after.dump();
    EXPECT_EQ(state_of(after, job)["generation"], gen[job])
        << "the takeover made a generation: " << after.dump();
    EXPECT_EQ(state_of(after, job)["trainers"], 2) << after.dump();
  }
  EXPECT_EQ(state_of(after, "jc")["state"], "pending") << after.dump();
  EXPECT_EQ(state_of(after, "jc")["generation"], 0) << after.dump();

  // The next change is numbered above the old ones and reaches the same trainers.
  std::string out;
  ASSERT_EQ(Ctl({"scale", "--job", "ja", "1"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return LastGeneration("ja") > gen["ja"]; }, milliseconds(60000)))
      << Logs();
  auto pids_after = Pids();
  for (const auto& [id, pids] : pids_before)
    EXPECT_EQ(pids_after[id], pids) << id << " was restarted" << Logs();
  for (const std::string job : {"ja", "jb"}) {
    for (const json& e : JobEvents(job)) {
      if (e.value("type", "") == "generation") {
        EXPECT_FALSE(e["failure"].get<bool>()) << e.dump() << Logs();
      }
    }
  }

  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(servers_[1]->Wait(milliseconds(10000)), 0) << Logs();
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(LeaderValue(), "");
}

// A standby pointed at an etcd that holds another server's state (a one-job server's, here) does
// not take it over: it refuses at start naming the cause and the fix, and writes nothing.
TEST_F(StandbyTest, AServerRefusesAnotherServersStateInEtcd) {
  servers_.push_back(StartEtcdServer("a", FreePort()));  // a one-job server of job itest
  ASSERT_FALSE(itest::WaitForPortFile(dir_.Join("a.port"), servers_[0].get()).empty()) << Logs();
  servers_[0]->Stop();
  std::vector<EtcdKv> before, after;
  ASSERT_TRUE(client_->Range("cluster/", jobserver::EtcdPrefixEnd("cluster/"), &before).ok());
  ASSERT_FALSE(before.empty());
  // A cluster server under the same name, and a one-job server of another job, on that etcd.
  servers_.push_back(StartEtcdServer("b", FreePort(), /*cluster=*/true));
  EXPECT_EQ(servers_[1]->Wait(milliseconds(30000)), 1) << Logs();
  EXPECT_NE(Slurp(dir_.Join("b.log")).find("single-job server's job itest"), std::string::npos)
      << Logs();
  servers_.push_back(StartEtcdServer("c", FreePort(), /*cluster=*/false, "other"));
  EXPECT_EQ(servers_[2]->Wait(milliseconds(30000)), 1) << Logs();
  const std::string c_log = Slurp(dir_.Join("c.log"));
  EXPECT_NE(c_log.find("--job_id itest"), std::string::npos) << c_log;
  ASSERT_TRUE(client_->Range("cluster/", jobserver::EtcdPrefixEnd("cluster/"), &after).ok());
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_EQ(after[i].value, before[i].value) << after[i].key;
}

TEST_F(StandbyTest, ALeaderPausedPastItsLeaseStopsWhenItWakes) {
  const int port_a = FreePort(), port_b = FreePort();
  servers_.push_back(StartEtcdServer("a", port_a));
  ASSERT_FALSE(itest::WaitForPortFile(dir_.Join("a.port"), servers_[0].get()).empty()) << Logs();
  servers_.push_back(StartEtcdServer("b", port_b));
  ASSERT_TRUE(WaitFor(
      [&] { return Slurp(dir_.Join("b.log")).find("standby for job itest") != std::string::npos; },
      milliseconds(30000)))
      << Logs();
  ASSERT_EQ(::kill(servers_[0]->pid(), SIGSTOP), 0);
  ASSERT_FALSE(itest::WaitForPortFile(dir_.Join("b.port"), servers_[1].get()).empty()) << Logs();
  ASSERT_EQ(::kill(servers_[0]->pid(), SIGCONT), 0);
  // a finds its lease gone and stops (fail-stop, exit 1) with the reason; b goes on leading.
  EXPECT_EQ(servers_[0]->Wait(milliseconds(30000)), 1) << Logs();
  EXPECT_NE(Slurp(dir_.Join("a.log")).find("lost the leadership of job itest"), std::string::npos)
      << Logs();
  EXPECT_NE(LeaderValue().find(std::to_string(port_b)), std::string::npos) << LeaderValue();
  EXPECT_TRUE(Listens(port_b));
}

TEST_F(StandbyTest, ADeposedLeaderCannotWriteAndALostLeaseIsReported) {
  std::atomic<int> lost{0};
  std::unique_ptr<jobserver::StateBackend> backend;
  jobserver::EtcdStateOptions o{store_, "fenced", 2, "test", {}};
  ASSERT_TRUE(jobserver::BecomeEtcdLeader(
                  o, [&](const Status&) { ++lost; }, &backend)
                  .ok());
  ASSERT_TRUE(backend->Write({{"job/fenced/meta", "one"}}, {}).ok());
  std::string v;
  bool found = false;
  ASSERT_TRUE(backend->Get("job/fenced/meta", &v, &found).ok());
  EXPECT_TRUE(found);
  EXPECT_EQ(v, "one");

  // Another server's leader key (deleted and created again: a new create_revision).
  const std::string key = jobserver::EtcdLeaderKey("fenced");
  bool ok = false;
  std::vector<std::vector<EtcdKv>> ranges;
  ASSERT_TRUE(
      client_->Txn({}, {{jobserver::EtcdOp::Kind::kDelete, key, "", 0}}, {}, &ok, &ranges).ok());
  ASSERT_TRUE(
      client_->Txn({}, {{jobserver::EtcdOp::Kind::kPut, key, "other", 0}}, {}, &ok, &ranges).ok());
  Status s = backend->Write({{"job/fenced/meta", "two"}}, {});
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("no longer the leader"), std::string::npos) << s.ToString();
  ASSERT_TRUE(backend->Get("job/fenced/meta", &v, &found).ok());
  EXPECT_EQ(v, "one") << "a deposed leader's write landed";
  backend.reset();

  // A leader whose lease is revoked behind its back is told so by its renewal.
  ASSERT_TRUE(
      client_->Txn({}, {{jobserver::EtcdOp::Kind::kDelete, key, "", 0}}, {}, &ok, &ranges).ok());
  ASSERT_TRUE(jobserver::BecomeEtcdLeader(
                  o, [&](const Status&) { ++lost; }, &backend)
                  .ok());
  std::vector<EtcdKv> kvs;
  ASSERT_TRUE(client_->Range(key, "", &kvs).ok());
  ASSERT_EQ(kvs.size(), 1u);
  ASSERT_TRUE(client_->LeaseRevoke(kvs[0].lease).ok());
  ASSERT_TRUE(WaitFor([&] { return lost.load() == 1; }, milliseconds(20000)));
  s = backend->Write({{"job/fenced/meta", "three"}}, {});
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
}

// Needs no etcd: nothing listens at the address given.
TEST(StandbyFlagsTest, AnUnreachableEtcdOrTwoStoresAreRefusedAtStart) {
  test::ScratchDir dir("edl-standby");
  const std::string secret = dir.Join("secret");
  itest::WriteSecretFile(secret, "integration-test-secret-0123456789");
  const std::string store = "etcd://127.0.0.1:" + std::to_string(FreePort());
  std::vector<std::string> argv = {test::EdlBinary(), "server",           "--server_port", "0",
                                   "--bind",          "127.0.0.1",        "--secret_file", secret,
                                   "--events_dir",    dir.Join("events"), "--state_store", store};
  EXPECT_EQ(itest::RunCommand(argv, dir.Join("a.log"), milliseconds(30000)), 1);
  const std::string log = Slurp(dir.Join("a.log"));
  EXPECT_NE(log.find("cannot reach etcd at " + store), std::string::npos) << log;
  argv.push_back("--state_dir");
  argv.push_back(dir.Join("state"));
  EXPECT_EQ(itest::RunCommand(argv, dir.Join("b.log"), milliseconds(30000)), 2);
  EXPECT_NE(Slurp(dir.Join("b.log")).find("not both"), std::string::npos)
      << Slurp(dir.Join("b.log"));
}

}  // namespace
}  // namespace edl
