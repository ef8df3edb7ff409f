// scripts/ssh_cluster.sh against a real sshd on two network-namespace machines (ssh_netns.h), with
// the real edl server and clients and stand-in trainers: the documented path (start, status, a
// client SIGKILLed and started again through the script, the server SIGKILLed and started again,
// stop), and a first day's mistakes, each of which must end in one message naming the node, the
// problem and the fix, a non-zero exit, and no process of the failed start left running:
//   a node's address that is not its own, a server address that is not the server host's, a node
//   holding another cluster secret (and --replace_secret), a trainer program missing, the server's
//   port in use, a new run directory beside an old checkpoint store (real `edl train` trainers: the
//   server is given the store, or every save is refused and `stop` says so), a client restarted
//   with another EDL_TRAINER_CMD, and `stop` while a node does not answer.
// Skips, saying why, without root, iproute2 or openssh.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/integration/ssh_netns.h"
#include "tests/testutil.h"

namespace edl {
namespace {

using itest::milliseconds;
using itest::Slurp;

class SshClusterTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string why = itest::SshNetns::WhyUnsupported(dir_.Join("why.log"));
    if (!why.empty()) {
      std::cout << "ssh cluster test skipped: " << why << "\n";
      GTEST_SKIP() << why;
    }
    net_ = std::make_unique<itest::SshNetns>(dir_.Join("net"), std::vector<std::string>{"a", "b"});
    const std::string err = net_->Build();
    ASSERT_EQ(err, "") << "cannot build the ssh machines";
    std::filesystem::create_directories(dir_.Join("operator"));
    env_ = net_->ScriptEnv();
    env_.insert({{"HOME", dir_.Join("operator")},
                 {"EDL_HOME", test::SourceDir()},
                 {"EDL_BIN", test::EdlBinary()},
                 {"EDL_RUN_DIR", dir_.Join("run")},
                 {"EDL_TRAINER_CMD", TrainerCmd()},
                 {"EDL_JOIN_TIMEOUT_S", "60"},
                 {"EDL_STOP_GRACE_S", "3"},
                 {"EDL_STOP_TIMEOUT_S", "10"},
                 {"EDL_PASS_ENV", ""},
                 // A node cut off is lost within 2 s; a stop waits at most 5 s for its trainers.
                 {"EDL_SERVER_ARGS", "--heartbeat_timeout_ms 2000 --stop_timeout_s 5"}});
  }

  // Whatever a failed test left: killed by pid (the assertions have spoken by then).
  void TearDown() override {
    if (!net_) return;
    for (const std::string& p : itest::ProcessesMentioning(dir_.path(), net_->SshdPids())) {
      ::kill(std::stoi(p), SIGKILL);
    }
  }

  std::string TrainerCmd() const {
    return "env STANDIN_RECORD=" + dir_.Join("records.jsonl") + " " + STAND_IN_TRAINER;
  }
  // The node name of machine `m`: unique to this process, so trainer sockets never collide.
  std::string Node(const std::string& m) const { return m + "-" + std::to_string(::getpid()); }

  // The hosts file: one line per machine, its address column (`addr` overrides) and one slot.
  std::string Hosts(const std::map<std::string, std::string>& addr = {}) {
    std::string text = "# written by ssh_cluster_test\n";
    for (const std::string m : {"a", "b"}) {
      const auto it = addr.find(m);
      text += net_->Target(m) + " " + (it == addr.end() ? net_->Addr(m) : it->second) +
              " name=" + Node(m) + " slots=1\n";
    }
    const std::string path = dir_.Join("hosts");
    std::ofstream(path) << text;
    return path;
  }

  // Runs scripts/ssh_cluster.sh ARGS (bounded); its output is Output() until the next run.
  int Script(const std::vector<std::string>& args,
             const std::map<std::string, std::string>& extra = {}) {
    std::map<std::string, std::string> env = env_;
    for (const auto& [k, v] : extra) env[k] = v;
    std::vector<std::string> argv = {"/bin/bash", test::SourceDir() + "/scripts/ssh_cluster.sh"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::filesystem::remove(dir_.Join("script.log"));
    itest::Proc p(argv, dir_.Join("script.log"), env);
    const int rc = p.Wait(milliseconds(240000));
    std::cout << "$ ssh_cluster.sh";
    for (const auto& a : args) std::cout << " " << a;
    std::cout << "  -> " << rc << "\n" << Output();
    return rc;
  }
  std::string Output() { return Slurp(dir_.Join("script.log")); }
  bool Says(const std::string& text) { return Output().find(text) != std::string::npos; }

  // Processes of this test still running (other than the machines' sshd).
  std::vector<std::string> Running() {
    return itest::ProcessesMentioning(dir_.path(), net_->SshdPids());
  }
  // True once none runs (the daemons of a stopped cluster exit on their own, promptly).
  bool NoneLeft() {
    return itest::WaitFor([&] { return Running().empty(); }, milliseconds(30000));
  }
  static std::string Join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += x + "\n";
    return s;
  }
  int PidOf(const std::string& pid_file) {
    return std::atoi(Slurp(dir_.Join("run/" + pid_file)).c_str());
  }
  bool Alive(int pid) { return pid > 0 && ::kill(pid, 0) == 0; }
  void Kill(int pid) {
    ASSERT_TRUE(Alive(pid));
    ::kill(pid, SIGKILL);
    ASSERT_TRUE(itest::WaitFor(
        [&] {
          const std::string stat = Slurp("/proc/" + std::to_string(pid) + "/stat");
          return stat.empty() || stat.find(") Z") != std::string::npos;
        },
        milliseconds(30000)));
  }

  // Nothing started and nothing of the failed start running.
  void ExpectNothingRuns() {
    EXPECT_TRUE(NoneLeft()) << Join(Running());
    EXPECT_FALSE(std::filesystem::exists(dir_.Join("run/server.pid")));
    EXPECT_FALSE(std::filesystem::exists(dir_.Join("run/client-" + Node("a") + ".pid")));
    EXPECT_FALSE(std::filesystem::exists(dir_.Join("run/client-" + Node("b") + ".pid")));
  }

  test::ScratchDir dir_{"edl-ssh"};
  std::unique_ptr<itest::SshNetns> net_;
  std::map<std::string, std::string> env_;
};

// docs/SSH.md's flow: start (which returns once both nodes run a trainer), status, a client
// SIGKILLed and started again through the script, the server SIGKILLed and started again (the
// clients re-attach), stop; and a node holding a session token of an earlier job is not told it
// was dropped.
TEST_F(SshClusterTest, StartStatusRestartAClientAndTheServerStop) {
  std::filesystem::create_directories(dir_.Join("run"));
  const std::string stale = dir_.Join("run/edl-" + Node("a") + ".session");
  std::ofstream(stale) << std::string(64, 'e') << "\n";
  ::chmod(stale.c_str(), 0600);
  const std::string hosts = Hosts();
  ASSERT_EQ(Script({"start", hosts}), 0);
  EXPECT_TRUE(Says("every node joined the job")) << Output();
  EXPECT_TRUE(Says("edl client (" + Node("a") + ") joined the server")) << Output();
  EXPECT_TRUE(Says("edl client (" + Node("b") + ") joined the server")) << Output();
  EXPECT_TRUE(Says("stop it with: scripts/ssh_cluster.sh stop " + hosts)) << Output();
  for (const std::string m : {"a", "b"}) {
    const std::string log = Slurp(dir_.Join("run/logs/client-" + Node(m) + ".out"));
    EXPECT_EQ(log.find("the server dropped this node"), std::string::npos) << log;
  }
  EXPECT_EQ(Script({"status", hosts}), 0);

  const int client_b = PidOf("client-" + Node("b") + ".pid");
  Kill(client_b);
  ASSERT_EQ(Script({"start", hosts}), 0);
  EXPECT_TRUE(Says("edl server is already running")) << Output();
  EXPECT_TRUE(Says("edl client (" + Node("a") + ") is already running")) << Output();
  EXPECT_TRUE(Says("edl client (" + Node("b") + ") joined the server")) << Output();
  EXPECT_NE(PidOf("client-" + Node("b") + ".pid"), client_b);

  const int server = PidOf("server.pid");
  Kill(server);
  ASSERT_EQ(Script({"start", hosts}), 0);
  EXPECT_NE(PidOf("server.pid"), server);
  EXPECT_TRUE(Says("edl client (" + Node("a") + ") joined the server")) << Output();
  EXPECT_TRUE(Says("edl client (" + Node("b") + ") joined the server")) << Output();

  ASSERT_EQ(Script({"stop", hosts}), 0);
  EXPECT_TRUE(Says("the job stopped and edl server")) << Output();
  EXPECT_TRUE(NoneLeft()) << Join(Running());
}

// 1. A node's address column mistyped: not an address of that machine.
TEST_F(SshClusterTest, NodeAddressThatIsNotItsOwnIsNamedAndNothingStarts) {
  EXPECT_EQ(Script({"start", Hosts({{"b", "10.241.0.33"}})}), 1);
  EXPECT_TRUE(Says("(node " + Node("b") + "): EDL_ADVERTISE_ADDR=10.241.0.33")) << Output();
  EXPECT_TRUE(Says("is not an address of")) << Output();
  EXPECT_TRUE(Says("fix the node's address column in the hosts file")) << Output();
  EXPECT_TRUE(Says("nothing was started")) << Output();
  ExpectNothingRuns();
}

// 2. The server's address mistyped: not the server host's (an IP literal resolves anywhere).
TEST_F(SshClusterTest, ServerAddressThatIsNotTheServerHostsIsNamedAndNothingStarts) {
  EXPECT_EQ(Script({"start", Hosts({{"a", "10.241.0.44"}})}), 1);
  EXPECT_TRUE(
      Says("(server): the server's address 10.241.0.44 (the clients connect to it) is not an "
           "address of"))
      << Output();
  EXPECT_TRUE(Says("nothing was started")) << Output();
  ExpectNothingRuns();
}

// 3. A node holding another cluster secret: named with the command that fixes it; --replace_secret
// pushes the operator's, and then the cluster starts.
TEST_F(SshClusterTest, NodeWithAnotherSecretIsNamedWithTheFixAndReplaceSecretPushesIt) {
  std::filesystem::create_directories(net_->Home("b") + "/.edl");
  const std::string other = net_->Home("b") + "/.edl/secret";
  itest::WriteSecretFile(other, std::string(64, '7'));
  const std::string hosts = Hosts();
  EXPECT_EQ(Script({"start", hosts}), 1);
  EXPECT_TRUE(Says(net_->Target("b") + ": holds a different cluster secret in .edl/secret"))
      << Output();
  EXPECT_TRUE(Says("scp -p " + dir_.Join("operator/.edl/secret") + " " + net_->Target("b") +
                   ":.edl/secret"))
      << Output();
  EXPECT_TRUE(Says("--replace_secret")) << Output();
  ExpectNothingRuns();
  EXPECT_EQ(Slurp(other), std::string(64, '7') + "\n")
      << "a secret was replaced without being asked";

  ASSERT_EQ(Script({"start", "--replace_secret", hosts}), 0);
  EXPECT_EQ(Slurp(other), Slurp(dir_.Join("operator/.edl/secret")));
  struct stat st;
  ASSERT_EQ(::stat(other.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(Script({"stop", hosts}), 0);
  EXPECT_TRUE(NoneLeft()) << Join(Running());
}

// 4. The trainer command's program missing on the nodes.
TEST_F(SshClusterTest, MissingTrainerProgramIsNamedOnEveryNodeAndNothingStarts) {
  EXPECT_EQ(Script({"start", Hosts()},
                   {{"EDL_TRAINER_CMD", "env OMP_NUM_THREADS=1 /opt/no-such/train --lr 1"}}),
            1);
  for (const std::string m : {"a", "b"}) {
    EXPECT_TRUE(Says("(node " + Node(m) + "): the trainer command's program '/opt/no-such/train'"))
        << Output();
  }
  EXPECT_TRUE(Says("is not found on")) << Output();
  ExpectNothingRuns();
}

// The server's port taken on the server host: named as EDL_SERVER_PORT, the variable the scripts
// take.
TEST_F(SshClusterTest, ServerPortInUseIsNamedAsEdlServerPort) {
  std::vector<std::string> argv = net_->Exec("a");
  for (const std::string& a : {std::string("/usr/bin/python3"), std::string("-c"),
                               std::string("import "
                                           "socket,time\ns=socket.socket()\ns.setsockopt(socket."
                                           "SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                                           "s.bind(('0.0.0.0',8180))\ns.listen()\nopen('" +
                                           dir_.Join("listening") +
                                           "','w').close()\n"
                                           "time.sleep(600)")}) {
    argv.push_back(a);
  }
  itest::Proc squatter(argv, dir_.Join("squatter.log"));
  squatter.ExpectExit(128 + SIGTERM);  // python3 dies of the SIGTERM that stops it
  ASSERT_TRUE(itest::WaitFor([&] { return std::filesystem::exists(dir_.Join("listening")); },
                             milliseconds(30000)))
      << Slurp(dir_.Join("squatter.log"));
  EXPECT_EQ(Script({"start", Hosts()}), 1);
  EXPECT_TRUE(Says("(server): port 8180 on")) << Output();
  EXPECT_TRUE(Says("is in use")) << Output();
  EXPECT_TRUE(Says("set EDL_SERVER_PORT to a free port")) << Output();
  EXPECT_FALSE(Says("--server_port")) << Output();
  squatter.Stop();
  ExpectNothingRuns();
}

// The newest generation among the checkpoints in `store` (`edl ckpt ls --json`), 0 when none.
int64_t NewestCheckpointGeneration(const std::string& store, const std::string& log) {
  if (itest::RunCommand({"/bin/sh", "-c",
                         test::EdlBinary() + " ckpt ls --json --checkpoint_dir '" + store + "' > " +
                             log + ".json"},
                        log) != 0) {
    return 0;
  }
  const nlohmann::json all = nlohmann::json::parse(Slurp(log + ".json"), nullptr, false);
  int64_t newest = 0;
  if (!all.is_array()) return 0;
  for (const auto& c : all) newest = std::max<int64_t>(newest, c.value("generation", 0));
  return newest;
}

// 5. A new run directory (the job's state gone, e.g. `git clean -xdf`) beside the checkpoint store
// of a run that reached a higher generation. With the store's path where the scripts cannot see it
// (a --config file) the new job resumes from it but the store's fence refuses every save: each
// refusal is a checkpoint_failed event with the fix, and `stop` exits 1 saying the final checkpoint
// was not saved. With --checkpoint_dir on the trainers' command line the scripts give it to the
// server, which numbers generations above the store's, and the saves land.
// The store's path holds a space, given backslash-escaped in EDL_TRAINER_CMD as a shell user
// would: it reaches the trainers and the server as one word (the saves land in it, not in a
// directory cut at the space).
TEST_F(SshClusterTest, NewRunDirectoryBesideAnOldCheckpointStore) {
  const std::string store = dir_.Join("ckpt dir");
  const std::string store_word = dir_.Join("ckpt\\ dir");
  const std::string train =
      test::EdlBinary() +
      " train --model resnet20 --data synthetic --image_size 8 --channels 1 "
      "--synthetic_train 256 --synthetic_test 8 --batch_size 8 --epochs 100000 "
      "--threads 1 --checkpoint_steps 4 --log_every 0 --eval 0";
  const std::string hosts = Hosts();
  const std::string log = dir_.Join("ckpt-ls.log");
  // The earlier run: generations raised by rescaling (1 <-> 2 trainers), then a save at the top.
  ASSERT_EQ(
      Script({"start", hosts}, {{"EDL_TRAINER_CMD", train + " --checkpoint_dir " + store_word}}),
      0);
  std::vector<std::string> ctl = net_->Exec("a");
  for (const std::string a :
       {test::EdlBinary(), std::string("ctl"), std::string("--server"), net_->Addr("a") + ":8180",
        std::string("--secret_file"), dir_.Join("operator/.edl/secret")}) {
    ctl.push_back(a);
  }
  auto status = [&] {
    std::vector<std::string> argv = ctl;
    argv.insert(argv.end(), {"status", "--json"});
    std::filesystem::remove(dir_.Join("status.json"));
    itest::RunCommand(argv, dir_.Join("status.json"));
    return nlohmann::json::parse(Slurp(dir_.Join("status.json")), nullptr, false);
  };
  auto generation = [&] {
    const nlohmann::json s = status();
    return s.is_object() && !s.value("pending", true) ? s.value("generation", int64_t{0})
                                                      : int64_t{0};
  };
  for (int round = 0; round < 4; ++round) {
    const int64_t before = generation();
    std::vector<std::string> argv = ctl;
    argv.insert(argv.end(), {"scale", round % 2 == 0 ? "1" : "2"});
    ASSERT_EQ(itest::RunCommand(argv, dir_.Join("ctl.log")), 0) << Slurp(dir_.Join("ctl.log"));
    ASSERT_TRUE(itest::WaitFor([&] { return generation() > before; }, milliseconds(120000)))
        << Slurp(dir_.Join("status.json"));
  }
  const int64_t top = generation();
  ASSERT_GE(top, 5);
  ASSERT_TRUE(itest::WaitFor([&] { return NewestCheckpointGeneration(store, log) >= top; },
                             milliseconds(120000)));
  ASSERT_EQ(Script({"stop", hosts}), 0);
  EXPECT_TRUE(NoneLeft()) << Join(Running());

  // The mistake: a new run directory, the store named only in a config file.
  std::filesystem::remove_all(dir_.Join("run"));
  std::ofstream(dir_.Join("train.ini")) << "checkpoint_dir = " << store << "\n";
  ASSERT_EQ(Script({"start", hosts},
                   {{"EDL_TRAINER_CMD", train + " --config " + dir_.Join("train.ini")}}),
            0);
  const std::string events = dir_.Join("run/events/edl-job.events.jsonl");
  auto refused = [&] {
    for (const auto& e : itest::ReadLines(events)) {
      if (e.value("event", "") == "checkpoint_failed" && e.value("refused", false)) return e;
    }
    return nlohmann::json();
  };
  ASSERT_TRUE(itest::WaitFor([&] { return !refused().is_null(); }, milliseconds(120000)))
      << "no refused save reached the events log " << events;
  const std::string error = refused().value("error", "");
  EXPECT_NE(error.find("before this writer started"), std::string::npos) << error;
  EXPECT_NE(error.find("--checkpoint_dir"), std::string::npos) << error;
  EXPECT_EQ(Script({"stop", hosts}), 1);
  EXPECT_TRUE(Says("the job stopped, but rank 0's final checkpoint was NOT saved")) << Output();
  EXPECT_TRUE(Says("before this writer started")) << Output();
  EXPECT_TRUE(NoneLeft()) << Join(Running());
  // The job is stopped, if not saved: the next start may use another command, without a second
  // stop.
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("run/trainer_cmd")))
      << "the stopped job's command is still recorded";
  EXPECT_LT(NewestCheckpointGeneration(store, log), top + 1) << "a save got past the fence";

  // The fix: the store on the trainers' command line, so the server numbers generations above it.
  std::filesystem::remove_all(dir_.Join("run"));
  ASSERT_EQ(
      Script({"start", hosts}, {{"EDL_TRAINER_CMD", train + " --checkpoint_dir " + store_word}}),
      0);
  EXPECT_TRUE(itest::WaitFor([&] { return NewestCheckpointGeneration(store, log) > top; },
                             milliseconds(120000)))
      << "no save of the new job landed in the store";
  EXPECT_EQ(Script({"stop", hosts}), 0);
  EXPECT_FALSE(Says("NOT saved")) << Output();
  EXPECT_TRUE(NoneLeft()) << Join(Running());
}

// Clients that cannot reach the server (here: EDL_SERVER given, to an address nobody has) are named
// with their last error line once EDL_JOIN_TIMEOUT_S passes, and what the start had started (the
// server, both clients) is stopped again.
TEST_F(SshClusterTest, ClientsThatNeverJoinAreNamedWithTheirLastErrorAndEverythingIsStopped) {
  EXPECT_EQ(
      Script({"start", Hosts()}, {{"EDL_SERVER", "10.241.0.99:8180"}, {"EDL_JOIN_TIMEOUT_S", "8"}}),
      1);
  EXPECT_TRUE(Says("these nodes did not join the job:")) << Output();
  for (const std::string m : {"a", "b"}) {
    EXPECT_TRUE(
        Says("  " + Node(m) + " (" + net_->Target(m) + "): edl client (" + Node(m) +
             ") did not join the server at 10.241.0.99:8180 with a running trainer within 8s"))
        << Output();
  }
  EXPECT_TRUE(Says("the client's last error: ")) << Output();
  EXPECT_TRUE(Says("nothing of it is left running")) << Output();
  ExpectNothingRuns();
}

// 6. A crashed client started again from a shell whose EDL_TRAINER_CMD differs (here: unset): the
// running job's command is named and nothing starts; with the job's command the node rejoins.
TEST_F(SshClusterTest, ClientRestartedWithAnotherTrainerCommandIsRefused) {
  const std::string hosts = Hosts();
  ASSERT_EQ(Script({"start", hosts}), 0);
  Kill(PidOf("client-" + Node("b") + ".pid"));
  const std::vector<std::string> before = Running();
  EXPECT_EQ(Script({"start", hosts}, {{"EDL_TRAINER_CMD", ""}}), 1);
  EXPECT_TRUE(
      Says("EDL_TRAINER_CMD here is '' but the job that runs (or was not stopped) was started "
           "with '" +
           TrainerCmd() + "'"))
      << Output();
  EXPECT_TRUE(Says("nothing was started")) << Output();
  std::vector<std::string> after = Running();
  std::sort(after.begin(), after.end());
  std::vector<std::string> sorted_before = before;
  std::sort(sorted_before.begin(), sorted_before.end());
  std::vector<std::string> new_ones;
  std::set_difference(after.begin(), after.end(), sorted_before.begin(), sorted_before.end(),
                      std::back_inserter(new_ones));
  EXPECT_TRUE(new_ones.empty()) << "the failed start left these running:\n" << Join(new_ones);
  ASSERT_EQ(Script({"start", hosts}), 0);
  EXPECT_TRUE(Says("edl client (" + Node("b") + ") joined the server")) << Output();
  ASSERT_EQ(Script({"stop", hosts}), 0);
  EXPECT_TRUE(NoneLeft()) << Join(Running());
}

// 7. `stop` while a node does not answer: the nodes that may still run are named with the advice to
// run stop again, which then stops them.
TEST_F(SshClusterTest, StopWithAnUnreachableNodeNamesItAndCanBeRunAgain) {
  const std::string hosts = Hosts();
  ASSERT_EQ(Script({"start", hosts}), 0);
  ASSERT_TRUE(net_->SetLink("b", false));
  EXPECT_EQ(Script({"stop", hosts}), 1);
  EXPECT_TRUE(Says("these hosts did not answer over ssh:\n  " + net_->Target("b") + ": "))
      << Output();
  EXPECT_TRUE(Says("the edl client and trainers of these nodes may still run:\n  " + Node("b") +
                   " (" + net_->Target("b") + ")"))
      << Output();
  EXPECT_TRUE(Says("run `scripts/ssh_cluster.sh stop " + hosts + "` again once they answer"))
      << Output();
  EXPECT_TRUE(Alive(PidOf("client-" + Node("b") + ".pid"))) << "the node behind the cut still runs";
  ASSERT_TRUE(net_->SetLink("b", true));
  EXPECT_EQ(Script({"stop", hosts}), 0);
  EXPECT_TRUE(NoneLeft()) << Join(Running());
}

}  // namespace
}  // namespace edl
