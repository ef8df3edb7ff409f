// Tests of scripts/start_job_server.sh, start_job_client.sh and ssh_cluster.sh with a stand-in
// `edl` (records its arguments and environment, then sleeps) and stand-in ssh/scp that run the
// "remote" side locally, each host with its own HOME (a host named dead* does not answer, as an
// unreachable one). Nothing touches the real home directory; every daemon a script starts is
// stopped through the script and then checked by pid.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "edl/base/flags.h"
#include "launcher/launcher.h"
#include "tests/integration/process_util.h"
#include "tests/launcher/launcher_util.h"
#include "tests/testutil.h"

namespace edl::launcher {
namespace {

using test::ProcessAlive;
using test::ReadFile;
using test::ReadPid;
using test::WaitExit;
using test::WriteFile;

class ScriptsTest : public testing::Test {
 protected:
  void SetUp() override {
    home_ = dir_.Join("home");
    std::filesystem::create_directories(home_);
    // Stand-in edl: one argument per line (after a "--" line) into $FAKE_EDL_ARGS, its environment
    // into $FAKE_EDL_ARGS.env.<role>.<node name>, then sleeps. `ctl ... status --json` (what the
    // scripts wait on; not recorded) lists every client with a pid file as connected to a job
    // that has all the trainers it wants; `ctl ... stop` plays the server's side of a whole-job
    // stop: the server (and so the job) exits.
    Exe("fake_edl",
        "#!/bin/sh\n"
        "case \" $* \" in \" ctl \"*\" status --json \"*)\n"
        "  printf '{\\n  \"done\": false,\\n  \"nodes\": [\\n'; sep=''\n"
        "  for f in \"$EDL_RUN_DIR\"/client-*.pid; do\n"
        "    [ -f \"$f\" ] || continue; n=${f##*/client-}; n=${n%.pid}\n"
        "    [ -f \"$EDL_RUN_DIR/refused-$n\" ] && continue\n"
        "    printf '%s    {\\n      \"connected\": true,\\n      \"name\": \"%s\",\\n      "
        "\"used\": 0\\n    }' \"$sep\" \"$n\"\n"
        "    sep=',\n'\n"
        "  done\n"
        "  printf '\\n  ],\\n  \"pending\": false,\\n  \"target\": 1,\\n  \"world_size\": "
        "1\\n}\\n'; exit 0 ;;\n"
        "esac\n"
        "{ echo --; for a in \"$@\"; do echo \"$a\"; done; } >> \"$FAKE_EDL_ARGS\"\n"
        "if [ \"$1\" = ctl ]; then kill \"$(cat \"$EDL_RUN_DIR/server.pid\")\"; exit 0; fi\n"
        "env > \"$FAKE_EDL_ARGS.env.$1.${EDL_NODE_NAME:-}\"\n"
        // FAKE_EDL_SAY: a line the stand-in logs (as a refused client would), and it stays
        // unlisted.
        "if [ -n \"${FAKE_EDL_SAY:-}\" ]; then echo \"$FAKE_EDL_SAY\" >&2; touch "
        "\"$EDL_RUN_DIR/refused-$EDL_NODE_NAME\"; fi\n"
        "exec sleep 1000\n");
    // Stand-in ssh: drops -o options; runs the command in bash with HOME=$FAKE_REMOTE/<host> and,
    // like ssh, none of the caller's environment beyond PATH.
    Exe("fake_ssh",
        "#!/bin/bash\nwhile [ \"${1:-}\" = -o ]; do shift 2; done\nhost=\"$1\"; shift\n"
        "case \"$host\" in dead*) echo \"ssh: connect to host $host port 22: No route to host\" "
        ">&2; exit 255;; esac\n"
        "h=\"$FAKE_REMOTE/${host#*@}\"; mkdir -p \"$h\"; cd \"$h\" &&\n"
        "exec env -i PATH=\"$PATH\" HOME=\"$h\" FAKE_EDL_ARGS=\"$FAKE_EDL_ARGS\" bash -c \"$*\"\n");
    Exe("fake_scp",
        "#!/bin/bash\nwhile [ \"${1:-}\" = -o ]; do shift 2; done\n[ \"$1\" = -p ] && shift\n"
        "dest=\"$2\"; host=\"${dest%%:*}\"; cd \"$FAKE_REMOTE/${host#*@}\" && cp -p \"$1\" "
        "\"${dest#*:}\"\n");
  }

  // Whatever a failed test left running: every pid file under run/.
  void TearDown() override {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_.Join("run"), ec)) {
      if (e.path().extension() != ".pid") continue;
      const int pid = ReadPid(e.path().string());
      if (ProcessAlive(pid)) ::kill(pid, SIGKILL);
    }
  }

  void Exe(const std::string& name, const std::string& text) {
    WriteFile(dir_.Join(name), text);
    ::chmod(dir_.Join(name).c_str(), 0755);
  }

  // Runs scripts/SCRIPT ARGS with the stand-ins; returns its exit status (-1 if it hung).
  int RunScript(const std::string& script, const std::vector<std::string>& args,
                const std::map<std::string, std::string>& extra_env = {}) {
    TrainerSpec spec;
    spec.argv = {"/bin/bash", edl::test::SourceDir() + "/scripts/" + script};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.env = {{"HOME", home_},
                {"EDL_BIN", dir_.Join("fake_edl")},
                {"FAKE_EDL_ARGS", dir_.Join("args")},
                {"EDL_RUN_DIR", dir_.Join("run")},
                {"EDL_SSH", dir_.Join("fake_ssh")},
                {"EDL_SCP", dir_.Join("fake_scp")},
                {"FAKE_REMOTE", dir_.Join("remote")},
                {"EDL_HOME", edl::test::SourceDir()},
                {"EDL_STOP_TIMEOUT_S", "5"}};
    for (const auto& [k, v] : extra_env) spec.env[k] = v;
    spec.log_path = dir_.Join("script.log");
    spec.working_dir = dir_.path();
    auto p = NewProcessLauncher()->Start(spec);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return -1;
    auto info = WaitExit(p.value().get());
    if (!info) return -1;
    return info->ShellStatus();
  }

  // The argument lists the stand-in edl was started with, in order.
  std::vector<std::vector<std::string>> Invocations() {
    std::vector<std::vector<std::string>> out;
    std::istringstream in(ReadFile(dir_.Join("args")));
    for (std::string line; std::getline(in, line);) {
      if (line == "--") {
        out.emplace_back();
      } else if (!out.empty()) {
        out.back().push_back(line);
      }
    }
    return out;
  }

  // The client invocation of node `name` (ssh_cluster.sh starts the clients all at once, in no
  // particular order), or an empty list.
  std::vector<std::string> ClientOf(const std::string& name) {
    for (const auto& args : Invocations()) {
      if (!args.empty() && args[0] == "client" && Flag(args, "--node_name") == name) return args;
    }
    return {};
  }

  static std::string Flag(const std::vector<std::string>& args, const std::string& flag) {
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == flag) return args[i + 1];
    }
    return "<absent>";
  }

  std::string Log() { return ReadFile(dir_.Join("script.log")); }

  // The environment the stand-in edl ran `role` with (node: its EDL_NODE_NAME), as "K=V" lines.
  std::string EnvOf(const std::string& role, const std::string& node = "") {
    return ReadFile(dir_.Join("args") + ".env." + role + "." + node);
  }

  // A secret in the test's HOME, as a node that got the server's copy holds it.
  void GiveSecret() {
    std::filesystem::create_directories(home_ + "/.edl");
    WriteFile(home_ + "/.edl/secret", std::string(64, 'a') + "0123456789abcdef");
    ::chmod((home_ + "/.edl/secret").c_str(), 0600);
  }

  // Stops every daemon of `hosts_file` through ssh_cluster.sh and checks that `pid_files` (under
  // the run directory) name no live process afterwards.
  void StopCluster(const std::string& hosts_file, const std::vector<std::string>& pid_files) {
    std::vector<int> pids;
    for (const std::string& f : pid_files) {
      pids.push_back(ReadPid(dir_.Join("run/" + f)));
      EXPECT_TRUE(ProcessAlive(pids.back())) << f;
    }
    EXPECT_EQ(RunScript("ssh_cluster.sh", {"stop", hosts_file}), 0) << Log();
    for (int pid : pids) {
      EXPECT_FALSE(ProcessAlive(pid)) << pid;
      if (ProcessAlive(pid)) ::kill(pid, SIGKILL);
    }
  }

  edl::test::ScratchDir dir_{"edl-scripts"};
  std::string home_;
};

TEST_F(ScriptsTest, ServerDaemonCreatesSecretRefusesTwiceAndStops) {
  ASSERT_EQ(RunScript("start_job_server.sh", {"--daemon", "--scale_script", "x.txt"}), 0) << Log();
  const std::string secret = home_ + "/.edl/secret";
  struct stat st;
  ASSERT_EQ(::stat(secret.c_str(), &st), 0) << "secret not created";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(ReadFile(secret).size(), 64u);
  const int pid = ReadPid(dir_.Join("run/server.pid"));
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(ProcessAlive(pid));
  auto inv = Invocations();
  ASSERT_EQ(inv.size(), 1u);
  EXPECT_EQ(inv[0][0], "server");
  EXPECT_EQ(Flag(inv[0], "--server_port"), "8180");
  EXPECT_EQ(Flag(inv[0], "--secret_file"), secret);
  EXPECT_EQ(Flag(inv[0], "--events_dir"), dir_.Join("run") + "/events");
  EXPECT_EQ(Flag(inv[0], "--state_dir"), dir_.Join("run") + "/state")
      << "a restarted server resumes the job";
  EXPECT_EQ(Flag(inv[0], "--http_addr"), "127.0.0.1:8181") << "the dashboard, on loopback";
  EXPECT_EQ(inv[0].back(), "x.txt") << "extra flags are passed through";

  // Start what is missing, leave what runs: the running server is reported and kept.
  EXPECT_EQ(RunScript("start_job_server.sh", {"--daemon"}), 0) << Log();
  EXPECT_NE(Log().find("already running (pid " + std::to_string(pid)), std::string::npos) << Log();
  EXPECT_NE(Log().find("kept"), std::string::npos) << Log();
  EXPECT_EQ(ReadPid(dir_.Join("run/server.pid")), pid);
  EXPECT_EQ(Invocations().size(), 1u) << "a second server was started";
  EXPECT_EQ(RunScript("start_job_server.sh", {"--status"}), 0);
  // --stop stops the whole job through the server (edl ctl stop), which then exits by itself.
  EXPECT_EQ(RunScript("start_job_server.sh", {"--stop"}), 0) << Log();
  inv = Invocations();
  ASSERT_EQ(inv.size(), 2u);
  EXPECT_EQ(inv[1][0], "ctl");
  EXPECT_EQ(inv[1].back(), "stop");
  EXPECT_EQ(Flag(inv[1], "--server"), "127.0.0.1:8180");
  EXPECT_EQ(Flag(inv[1], "--secret_file"), secret);
  EXPECT_NE(Log().find("the job stopped and edl server (pid " + std::to_string(pid) + ") exited"),
            std::string::npos)
      << Log();
  EXPECT_FALSE(ProcessAlive(pid));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("run/server.pid")));
  EXPECT_EQ(RunScript("start_job_server.sh", {"--status"}), 3);
  if (ProcessAlive(pid)) ::kill(pid, SIGKILL);
}

// A port the server cannot bind (here: bound, not listening, so the check before the start does
// not see it) makes the real server exit at once: the script says so, naming EDL_SERVER_PORT (the
// variable it takes) rather than only the server's --server_port, and leaves no pid file.
TEST_F(ScriptsTest, ServerThatCannotBindItsPortIsReportedWithEdlServerPort) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  EXPECT_EQ(RunScript("start_job_server.sh", {"--daemon"},
                      {{"EDL_BIN", edl::test::EdlBinary()}, {"EDL_SERVER_PORT", port}}),
            1)
      << Log();
  ::close(fd);
  EXPECT_NE(Log().find("edl server exited at start"), std::string::npos) << Log();
  EXPECT_NE(Log().find("set EDL_SERVER_PORT to a free port"), std::string::npos) << Log();
  EXPECT_NE(Log().find("now " + port), std::string::npos) << Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("run/server.pid")));
}

// The real server and a client holding another secret: the client exits, and the script says so
// with the client's own error line instead of reporting it started; nothing of it is left.
TEST_F(ScriptsTest, ClientThatExitsBeforeJoiningIsReportedWithItsError) {
  const std::string port = std::to_string(itest::FreePort());
  const std::map<std::string, std::string> real = {{"EDL_BIN", edl::test::EdlBinary()},
                                                   {"EDL_SERVER_PORT", port}};
  ASSERT_EQ(RunScript("start_job_server.sh", {"--daemon"}, real), 0) << Log();
  const int server = ReadPid(dir_.Join("run/server.pid"));
  itest::WriteSecretFile(dir_.Join("other-secret"),
                         "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
  std::map<std::string, std::string> client = real;
  client.insert({{"EDL_NODE_NAME", "n1"},
                 {"EDL_SECRET_FILE", dir_.Join("other-secret")},
                 {"EDL_TRAINER_CMD", "/bin/sleep 1000"},
                 {"EDL_JOIN_TIMEOUT_S", "60"}});
  EXPECT_EQ(RunScript("start_job_client.sh", {"--daemon"}, client), 1) << Log();
  // Exited at once (within edl_run's first look) or later, while the script waited for it to join.
  EXPECT_NE(Log().find("edl client (n1) exited"), std::string::npos) << Log();
  EXPECT_NE(Log().find("--secret_file"), std::string::npos) << "the client's own reason: " << Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("run/client-n1.pid")));
  EXPECT_EQ(RunScript("start_job_server.sh", {"--stop"}, real), 0) << Log();
  EXPECT_TRUE(test::WaitUntil([&] { return !ProcessAlive(server); }));
  if (ProcessAlive(server)) ::kill(server, SIGKILL);
}

// A standby started by the script (EDL_STANDBY=1) beside the real server: refused while no server
// runs to be the standby of; once the server is SIGKILLed the standby leads and the script treats
// it as the server (--status, its pid file); --stop stops a standby that still waits first, then
// the job through the leader, so nothing is left to take the stopped job over.
TEST_F(ScriptsTest, AStandbyTakesOverAndStopStopsTheJobThroughIt) {
  const std::string port = std::to_string(itest::FreePort());
  const std::map<std::string, std::string> real = {
      {"EDL_BIN", edl::test::EdlBinary()}, {"EDL_SERVER_PORT", port}, {"EDL_HTTP_ADDR", "off"}};
  std::map<std::string, std::string> standby = real;
  standby["EDL_STANDBY"] = "1";
  EXPECT_EQ(RunScript("start_job_server.sh", {"--daemon"}, standby), 1) << Log();
  EXPECT_NE(Log().find("start it first, without EDL_STANDBY"), std::string::npos) << Log();
  ASSERT_EQ(RunScript("start_job_server.sh", {"--daemon"}, real), 0) << Log();
  const int leader = ReadPid(dir_.Join("run/server.pid"));
  ASSERT_EQ(RunScript("start_job_server.sh", {"--daemon"}, standby), 0) << Log();
  EXPECT_NE(Log().find("the leader is pid " + std::to_string(leader)), std::string::npos) << Log();
  const int first = ReadPid(dir_.Join("run/standby.pid"));

  ASSERT_EQ(::kill(leader, SIGKILL), 0);
  ASSERT_TRUE(test::WaitUntil([&] { return !ProcessAlive(leader); }));
  // Once it listens, the script finds the standby leading and makes it the server.
  EXPECT_TRUE(test::WaitUntil([&] {
    return RunScript("start_job_server.sh", {"--status"}, real) == 0 &&
           Log().find("running (pid " + std::to_string(first) + ")") != std::string::npos;
  })) << Log();
  EXPECT_EQ(ReadPid(dir_.Join("run/server.pid")), first);
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("run/standby.pid")));

  ASSERT_EQ(RunScript("start_job_server.sh", {"--daemon"}, standby), 0) << Log();
  EXPECT_NE(Log().find("the leader is pid " + std::to_string(first)), std::string::npos) << Log();
  const int second = ReadPid(dir_.Join("run/standby.pid"));
  EXPECT_EQ(RunScript("start_job_server.sh", {"--stop"}, real), 0) << Log();
  EXPECT_NE(Log().find("edl server standby (pid " + std::to_string(second) + ") stopped"),
            std::string::npos)
      << Log();
  EXPECT_TRUE(test::WaitUntil([&] { return !ProcessAlive(first) && !ProcessAlive(second); }));
  for (int pid : {first, second}) {
    if (ProcessAlive(pid)) ::kill(pid, SIGKILL);
  }
  EXPECT_NE(ReadFile(dir_.Join("run/logs/standby.out")).find("stopped while a standby"),
            std::string::npos);
  // The leader and both standbys wrote their output here (the daemons are not this test's children,
  // so their exits are read from what they logged and from their pids being gone).
  edl::test::ExpectNoSanitizerReport(dir_.Join("run/logs/server.out"), "edl server");
  edl::test::ExpectNoSanitizerReport(dir_.Join("run/logs/standby.out"), "edl server standby");
}

TEST_F(ScriptsTest, ClientTakesOverridesFromEnv) {
  GiveSecret();
  ASSERT_EQ(RunScript("start_job_client.sh", {"--daemon"},
                      {{"EDL_SERVER", "10.1.1.1:9000"},
                       {"EDL_GPUS", "0,1"},
                       {"EDL_ADVERTISE_ADDR", "127.0.0.3"},
                       {"EDL_TRAINER_CMD", "python3 train.py --lr 0.1"},
                       {"EDL_NODE_NAME", "n7"},
                       {"EDL_MODE", "restart"}}),
            0)
      << Log();
  const int pid = ReadPid(dir_.Join("run/client-n7.pid"));
  ASSERT_GT(pid, 0);
  auto inv = Invocations();
  ASSERT_EQ(inv.size(), 1u);
  EXPECT_EQ(inv[0][0], "client");
  EXPECT_EQ(Flag(inv[0], "--server"), "10.1.1.1:9000");
  EXPECT_EQ(Flag(inv[0], "--gpus"), "0,1");
  EXPECT_EQ(Flag(inv[0], "--trainer_cmd"), "python3 train.py --lr 0.1");
  EXPECT_EQ(Flag(inv[0], "--node_name"), "n7");
  EXPECT_EQ(Flag(inv[0], "--mode"), "restart");
  EXPECT_EQ(Flag(inv[0], "--advertise_addr"), "127.0.0.3");
  EXPECT_EQ(Flag(inv[0], "--state_dir"), dir_.Join("run"))
      << "the session token lives with the run";
  EXPECT_EQ(Flag(inv[0], "--socket_dir"), "/tmp") << "EDL_SOCKET_DIR's default";
  EXPECT_NE(Log().find("edl client (n7) joined the server at 10.1.1.1:9000"), std::string::npos)
      << Log();
  EXPECT_EQ(RunScript("start_job_client.sh", {"--stop"}, {{"EDL_NODE_NAME", "n7"}}), 0) << Log();
  EXPECT_FALSE(ProcessAlive(pid));
  if (ProcessAlive(pid)) ::kill(pid, SIGKILL);
}

// A run directory that cannot be used, and a socket directory that is not one, are named with the
// fix before anything starts (not a raw mkdir error); EDL_SOCKET_DIR reaches the client.
TEST_F(ScriptsTest, AnUnusableRunDirOrSocketDirIsNamedBeforeAnythingStarts) {
  GiveSecret();
  const std::string bad_run = "/proc/edl-scripts-test/run";  // not creatable, even by root
  EXPECT_EQ(RunScript("start_job_server.sh", {"--daemon"}, {{"EDL_RUN_DIR", bad_run}}), 1) << Log();
  EXPECT_NE(Log().find("EDL_RUN_DIR=" + bad_run + " cannot be used"), std::string::npos) << Log();
  EXPECT_EQ(RunScript("start_job_client.sh", {"--daemon"},
                      {{"EDL_RUN_DIR", bad_run}, {"EDL_NODE_NAME", "n1"}}),
            1)
      << Log();
  EXPECT_NE(Log().find("EDL_RUN_DIR=" + bad_run + " cannot be used"), std::string::npos) << Log();
  EXPECT_EQ(RunScript("start_job_client.sh", {"--daemon"},
                      {{"EDL_SOCKET_DIR", dir_.Join("no-such-dir")}, {"EDL_NODE_NAME", "n1"}}),
            1)
      << Log();
  EXPECT_NE(Log().find("EDL_SOCKET_DIR=" + dir_.Join("no-such-dir") + " is not a directory"),
            std::string::npos)
      << Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("args"))) << "edl was started";
  std::filesystem::create_directories(dir_.Join("sock"));
  ASSERT_EQ(RunScript("start_job_client.sh", {"--daemon"},
                      {{"EDL_SOCKET_DIR", dir_.Join("sock")}, {"EDL_NODE_NAME", "n1"}}),
            0)
      << Log();
  EXPECT_EQ(Flag(Invocations().at(0), "--socket_dir"), dir_.Join("sock"));
  const int pid = ReadPid(dir_.Join("run/client-n1.pid"));
  EXPECT_EQ(RunScript("start_job_client.sh", {"--stop"}, {{"EDL_NODE_NAME", "n1"}}), 0) << Log();
  EXPECT_FALSE(ProcessAlive(pid));
}

// A node name another connected client holds is refused by the server until that client goes: the
// script says so at once and stops the client it started, instead of waiting out the join timeout.
TEST_F(ScriptsTest, ANodeNameHeldByAnotherConnectedClientIsReportedAtOnce) {
  GiveSecret();
  const std::string line =
      "E1129 server refused: Unavailable: node name 'n1' belongs to another client (connected from "
      "10.0.0.7) and "
      "this one did not present that node's session token; retrying.";
  EXPECT_EQ(
      RunScript("start_job_client.sh", {"--daemon"},
                {{"EDL_NODE_NAME", "n1"}, {"FAKE_EDL_SAY", line}, {"EDL_JOIN_TIMEOUT_S", "3600"}}),
      1)
      << Log();
  EXPECT_NE(
      Log().find("refuses node name n1: it belongs to another client (connected from 10.0.0.7)"),
      std::string::npos)
      << Log();
  EXPECT_NE(Log().find("give this client its own name"), std::string::npos) << Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("run/client-n1.pid")))
      << "the client it started was not stopped";
}

// A client without the secret stops with the fix: a secret made here could never match the
// server's.
TEST_F(ScriptsTest, ClientNeverCreatesASecret) {
  EXPECT_EQ(RunScript("start_job_client.sh", {"--daemon"}, {{"EDL_NODE_NAME", "n1"}}), 1) << Log();
  EXPECT_NE(Log().find("does not exist"), std::string::npos) << Log();
  EXPECT_NE(Log().find("scp -p"), std::string::npos) << "the fix is named: " << Log();
  EXPECT_FALSE(std::filesystem::exists(home_ + "/.edl/secret"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("args"))) << "edl was started";
}

// The advertise address follows the server: loopback for a server on this machine, the source
// address of the route to a remote one (never a silent 127.0.0.1 towards another machine).
TEST_F(ScriptsTest, ClientAdvertisesTheAddressItReachesTheServerFrom) {
  GiveSecret();
  ASSERT_EQ(RunScript("start_job_client.sh", {"--daemon"},
                      {{"EDL_SERVER", "127.0.0.1:9000"}, {"EDL_NODE_NAME", "local"}}),
            0)
      << Log();
  EXPECT_EQ(Flag(Invocations().at(0), "--advertise_addr"), "127.0.0.1");
  EXPECT_EQ(RunScript("start_job_client.sh", {"--stop"}, {{"EDL_NODE_NAME", "local"}}), 0) << Log();

  // The route to a documentation address (TEST-NET-3), if this machine has one.
  TrainerSpec ip;
  ip.argv = {"/bin/sh", "-c",
             "ip -o route get 203.0.113.7 | awk '{for(i=1;i<NF;i++) if($i==\"src\"){print $(i+1); "
             "exit}}'"};
  ip.log_path = dir_.Join("route.log");
  auto p = NewProcessLauncher()->Start(ip);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(WaitExit(p.value().get()).has_value());
  std::string src = ReadFile(dir_.Join("route.log"));
  while (!src.empty() && src.back() == '\n') src.pop_back();
  if (src.empty())
    GTEST_SKIP() << "this machine has no route to 203.0.113.7 to check the remote case";
  ASSERT_EQ(RunScript("start_job_client.sh", {"--daemon"},
                      {{"EDL_SERVER", "203.0.113.7:9000"}, {"EDL_NODE_NAME", "remote"}}),
            0)
      << Log();
  EXPECT_EQ(Flag(Invocations().at(1), "--advertise_addr"), src);
  EXPECT_EQ(RunScript("start_job_client.sh", {"--stop"}, {{"EDL_NODE_NAME", "remote"}}), 0)
      << Log();
}

// A client is not started on a node whose given address is not its own (its trainers could not
// bind it) or whose trainer program is missing: every problem is named, nothing runs.
TEST_F(ScriptsTest, ClientRefusesAForeignAddressAndAMissingTrainerProgram) {
  GiveSecret();
  EXPECT_EQ(RunScript("start_job_client.sh", {"--daemon"},
                      {{"EDL_SERVER", "127.0.0.1:9000"},
                       {"EDL_NODE_NAME", "n1"},
                       {"EDL_ADVERTISE_ADDR", "192.0.2.33"},
                       {"EDL_TRAINER_CMD", "env OMP_NUM_THREADS=1 /no/such/train.bin --x 'a b'"}}),
            1)
      << Log();
  EXPECT_NE(
      Log().find(
          "EDL_ADVERTISE_ADDR=192.0.2.33 (this node's address, which its trainers bind) is not "
          "an address of"),
      std::string::npos)
      << Log();
  EXPECT_NE(Log().find("the trainer command's program '/no/such/train.bin'"), std::string::npos)
      << Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("args"))) << "edl was started";
  EXPECT_EQ(RunScript("start_job_client.sh", {"--check"},
                      {{"EDL_SERVER", "127.0.0.1:9000"},
                       {"EDL_ADVERTISE_ADDR", "127.0.0.1"},
                       {"EDL_TRAINER_CMD", "env OMP_NUM_THREADS=1 /bin/true"}}),
            0)
      << Log();
}

TEST_F(ScriptsTest, ClientRefusesAServerItCannotResolve) {
  GiveSecret();
  EXPECT_EQ(RunScript("start_job_client.sh", {"--daemon"},
                      {{"EDL_SERVER", "nodeA.invalid:8180"}, {"EDL_NODE_NAME", "n1"}}),
            1)
      << Log();
  EXPECT_NE(Log().find("cannot resolve the server host 'nodeA.invalid'"), std::string::npos)
      << Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("args"))) << "edl was started";
}

TEST_F(ScriptsTest, SshClusterStartsEveryHostCopiesSecretAndStops) {
  WriteFile(dir_.Join("hosts"), "# two nodes\nnodeA\n\nuser@nodeB 127.0.0.2\n");
  ASSERT_EQ(RunScript("ssh_cluster.sh", {"start", dir_.Join("hosts")}, {{"EDL_SLOTS", "3"}}), 0)
      << Log();
  const std::string local_secret = ReadFile(home_ + "/.edl/secret");
  ASSERT_EQ(local_secret.size(), 64u);
  for (const char* host : {"nodeA", "nodeB"}) {
    const std::string remote = dir_.Join("remote/") + host + "/.edl/secret";
    EXPECT_EQ(ReadFile(remote), local_secret) << "secret not copied to " << host;
    struct stat st;
    ASSERT_EQ(::stat(remote.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  auto inv = Invocations();
  ASSERT_EQ(inv.size(), 3u) << ReadFile(dir_.Join("args"));
  EXPECT_EQ(inv[0][0], "server");
  EXPECT_EQ(Flag(inv[0], "--secret_file"), dir_.Join("remote/nodeA/.edl/secret"));
  const auto a = ClientOf("nodeA"), b = ClientOf("nodeB");
  ASSERT_FALSE(a.empty() || b.empty()) << ReadFile(dir_.Join("args"));
  // nodeA is an ssh alias without an address column: the clients get the address nodeA reports.
  EXPECT_NE(Flag(a, "--server"), "nodeA:8180");
  EXPECT_EQ(Flag(a, "--server"), Flag(a, "--advertise_addr") + ":8180");
  EXPECT_EQ(Flag(a, "--slots"), "3");
  EXPECT_EQ(Flag(b, "--advertise_addr"), "127.0.0.2");
  std::vector<int> pids;
  for (const char* f : {"run/server.pid", "run/client-nodeA.pid", "run/client-nodeB.pid"}) {
    pids.push_back(ReadPid(dir_.Join(f)));
    EXPECT_TRUE(ProcessAlive(pids.back())) << f;
  }
  EXPECT_EQ(RunScript("ssh_cluster.sh", {"status", dir_.Join("hosts")}), 0) << Log();
  EXPECT_EQ(RunScript("ssh_cluster.sh", {"stop", dir_.Join("hosts")}), 0) << Log();
  for (int pid : pids) {
    EXPECT_FALSE(ProcessAlive(pid)) << pid;
    if (ProcessAlive(pid)) ::kill(pid, SIGKILL);
  }
  EXPECT_NE(RunScript("ssh_cluster.sh", {"status", dir_.Join("hosts")}), 0);
}

// `start` again after a client died starts that client only: the server and the other client are
// reported and kept (same pids, no second server); `stop` goes through the server first.
TEST_F(ScriptsTest, SshClusterStartAgainStartsWhatIsMissingAndKeepsWhatRuns) {
  WriteFile(dir_.Join("hosts"), "nodeA 127.0.0.1\nnodeB 127.0.0.1\n");
  ASSERT_EQ(RunScript("ssh_cluster.sh", {"start", dir_.Join("hosts")}), 0) << Log();
  const int server = ReadPid(dir_.Join("run/server.pid"));
  const int a = ReadPid(dir_.Join("run/client-nodeA.pid"));
  const int b = ReadPid(dir_.Join("run/client-nodeB.pid"));
  ASSERT_TRUE(ProcessAlive(b));
  ASSERT_EQ(::kill(b, SIGKILL), 0);  // nodeB's client crashed
  ASSERT_TRUE(test::WaitUntil([&] { return !ProcessAlive(b); }));
  ASSERT_EQ(RunScript("ssh_cluster.sh", {"start", dir_.Join("hosts")}), 0) << Log();
  EXPECT_NE(Log().find("edl server is already running (pid " + std::to_string(server)),
            std::string::npos)
      << Log();
  EXPECT_NE(Log().find("edl client (nodeA) is already running (pid " + std::to_string(a)),
            std::string::npos)
      << Log();
  EXPECT_EQ(ReadPid(dir_.Join("run/server.pid")), server);
  EXPECT_EQ(ReadPid(dir_.Join("run/client-nodeA.pid")), a);
  const int b2 = ReadPid(dir_.Join("run/client-nodeB.pid"));
  EXPECT_NE(b2, b);
  EXPECT_TRUE(ProcessAlive(b2));
  auto inv = Invocations();
  ASSERT_EQ(inv.size(), 4u) << ReadFile(dir_.Join("args"));
  EXPECT_EQ(inv[3][0], "client");
  EXPECT_EQ(Flag(inv[3], "--node_name"), "nodeB");
  StopCluster(dir_.Join("hosts"), {"server.pid", "client-nodeA.pid", "client-nodeB.pid"});
  inv = Invocations();
  ASSERT_EQ(inv.size(), 5u) << ReadFile(dir_.Join("args"));
  EXPECT_EQ(inv[4][0], "ctl") << "the job is stopped through the server, not host by host";
  EXPECT_LT(Log().find("stopping the job through edl server"),
            Log().find("of the edl clients of nodes"))
      << Log();
}

// The MPI / Horovod form (slots=N), node names, keyed columns, and EDL_PASS_ENV's variables.
TEST_F(ScriptsTest, SshClusterReadsMpiFormNodeNamesAndPassesEnv) {
  WriteFile(dir_.Join("hosts"),
            "nodeA slots=4 addr=127.0.0.1 name=alpha  # MPI form plus keys\n"
            "user@nodeB 127.0.0.1 beta slots=2 max_slots=8\n");
  ASSERT_EQ(RunScript("ssh_cluster.sh", {"start", dir_.Join("hosts")},
                      {{"NCCL_DEBUG", "INFO"},
                       {"GLOO_SOCKET_IFNAME", "lo"},
                       {"MY_DATA", "/d a"},
                       {"UNPASSED", "x"},
                       {"EDL_PASS_ENV", "NCCL_* GLOO_* MY_DATA"}}),
            0)
      << Log();
  auto inv = Invocations();
  ASSERT_EQ(inv.size(), 3u) << ReadFile(dir_.Join("args"));
  const auto alpha = ClientOf("alpha"), beta = ClientOf("beta");
  ASSERT_FALSE(alpha.empty() || beta.empty()) << ReadFile(dir_.Join("args"));
  EXPECT_EQ(Flag(alpha, "--slots"), "4");
  EXPECT_EQ(Flag(alpha, "--server"), "127.0.0.1:8180") << "the address column reaches the server";
  EXPECT_EQ(Flag(alpha, "--advertise_addr"), "127.0.0.1");
  EXPECT_EQ(Flag(beta, "--slots"), "2");
  for (const std::string& env :
       {EnvOf("client", "alpha"), EnvOf("client", "beta"), EnvOf("server")}) {
    EXPECT_NE(env.find("NCCL_DEBUG=INFO\n"), std::string::npos) << env;
    EXPECT_NE(env.find("GLOO_SOCKET_IFNAME=lo\n"), std::string::npos) << env;
    EXPECT_NE(env.find("MY_DATA=/d a\n"), std::string::npos) << env;
    EXPECT_EQ(env.find("UNPASSED"), std::string::npos) << env;
  }
  StopCluster(dir_.Join("hosts"), {"server.pid", "client-alpha.pid", "client-beta.pid"});
}

// An unreachable host is named before anything is tried: no secret made or copied, nothing started.
TEST_F(ScriptsTest, SshClusterNamesAnUnreachableHostAndStartsNothing) {
  WriteFile(dir_.Join("hosts"), "nodeA 127.0.0.1\ndeadhost 10.0.0.9\n");
  EXPECT_EQ(RunScript("ssh_cluster.sh", {"start", dir_.Join("hosts")}), 1) << Log();
  EXPECT_NE(Log().find("cannot reach these hosts over ssh"), std::string::npos) << Log();
  EXPECT_NE(Log().find("deadhost: ssh: connect to host deadhost"), std::string::npos) << Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("args"))) << "something was started";
  EXPECT_FALSE(std::filesystem::exists(home_ + "/.edl/secret"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("remote/nodeA/.edl/secret")));
}

// A server address that the clients cannot resolve (an ssh alias given as the address) is refused
// at start instead of clients retrying "cannot resolve" forever.
TEST_F(ScriptsTest, SshClusterRefusesAServerAddressClientsCannotResolve) {
  WriteFile(dir_.Join("hosts"), "nodeA gpu-alias.invalid\nnodeB 127.0.0.1\n");
  EXPECT_EQ(RunScript("ssh_cluster.sh", {"start", dir_.Join("hosts")}), 1) << Log();
  EXPECT_NE(Log().find("cannot resolve the server address gpu-alias.invalid"), std::string::npos)
      << Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("args"))) << "something was started";
}

TEST_F(ScriptsTest, SshClusterRejectsMalformedHostsLines) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"nodeA slots=x\n", "line 1: slots=x is not a positive number"},
      {"# c\nnodeA colour=red\n", "line 2: unknown key 'colour'"},
      {"nodeA 10.0.0.1 a b\n", "line 1: too many columns"},
      {"nodeA name=x\nnodeB name=x\n", "node name x is used twice"},
      // One machine listed twice: `name=` would only double-book it.
      {"nodeA 10.0.0.1\nuser@nodeA name=b\n", "line 2: host nodeA is listed twice"},
      {"nodeA 10.0.0.1\nnodeB 10.0.0.1\n", "line 2: address 10.0.0.1 is also node nodeA's"},
      // Windows line endings: named as such, not as a bad address or name.
      {"nodeA 10.0.0.1 slots=1\r\nnodeB 10.0.0.2\r\n", "line 1 ends with a carriage return"}};
  for (const auto& [hosts, error] : cases) {
    WriteFile(dir_.Join("hosts"), hosts);
    EXPECT_EQ(RunScript("ssh_cluster.sh", {"start", dir_.Join("hosts")}), 1) << hosts << Log();
    EXPECT_NE(Log().find(error), std::string::npos) << hosts << "\n" << Log();
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("args"))) << "something was started";
}

TEST_F(ScriptsTest, SshClusterRejectsBadUsage) {
  EXPECT_EQ(RunScript("ssh_cluster.sh", {"launch", dir_.Join("hosts")}), 2);
  EXPECT_EQ(RunScript("ssh_cluster.sh", {"start", dir_.Join("no-such-hosts")}), 1);
  EXPECT_NE(Log().find("no-such-hosts"), std::string::npos) << Log();
}

TEST(ScriptsLintTest, ShellcheckClean) {
  if (std::system("command -v shellcheck >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "shellcheck is not installed (apt-get install shellcheck)";
  }
  const std::string cmd =
      "cd " + edl::test::SourceDir() +
      " && shellcheck -x scripts/start_job_server.sh scripts/start_job_client.sh "
      "scripts/ssh_cluster.sh scripts/edl_common.sh scripts/slurm/edl.sbatch";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// The scripts split EDL_TRAINER_CMD (for its program and its --checkpoint_dir) as the client
// splits --trainer_cmd (edl::SplitCommandLine): the same words, the same refusals.
TEST(ScriptsLintTest, TheScriptsSplitACommandAsTheClientDoes) {
  edl::test::ScratchDir dir("edl-split");
  const std::vector<std::string> lines = {
      "edl train --epochs 3",
      "edl train --checkpoint_dir /data/ckpt\\ dir/g2",
      "env A=1 'my prog' \"x y\" z'w'",
      "a \"b\\\"c\\\\d\\$e\\f\" 'g\\h'",
      "  lead\ttab  ",
      "a '' b",
      "a 'b",
      "a \"b",
      "ends\\",
  };
  for (const std::string& line : lines) {
    const std::string in = dir.path() + "/line", out = dir.path() + "/words";
    std::ofstream(in) << line;
    const std::string cmd =
        "bash -c 'source " + edl::test::SourceDir() +
        "/scripts/edl_common.sh; l=$(cat \"$1\"); edl_split_command \"$l\" || exit 3; "
        "for w in \"${EDL_WORDS[@]}\"; do printf \"%s\\0\" \"$w\"; done' _ " +
        in + " >" + out;
    const int rc = WEXITSTATUS(std::system(cmd.c_str()));
    auto want = edl::SplitCommandLine(line, "--trainer_cmd");
    SCOPED_TRACE(line);
    if (!want.ok()) {
      EXPECT_EQ(rc, 3) << "the scripts accept what the client refuses: "
                       << want.status().ToString();
      continue;
    }
    ASSERT_EQ(rc, 0);
    std::vector<std::string> got;
    const std::string words = ReadFile(out);
    for (size_t at = 0; at < words.size();) {
      const size_t nul = words.find('\0', at);
      got.push_back(words.substr(at, nul - at));
      at = nul + 1;
    }
    EXPECT_EQ(got, want.value());
  }
}

// The job server's rooms keep their order (scripts/check_layers.sh): none includes one above it;
// and the check names an include that does.
TEST(ScriptsLintTest, JobserverRoomsIncludeOnlyRoomsBelowThem) {
  edl::test::ScratchDir dir("edl-layers");
  const std::string out = dir.path() + "/out";
  const std::string cmd =
      "cd " + edl::test::SourceDir() + " && scripts/check_layers.sh >" + out + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadFile(out);
  // A copy of the tree's layering with one include reaching up: the policy including the server.
  const std::string copy = dir.path() + "/tree";
  const std::string setup =
      "mkdir -p " + copy + "/scripts " + copy + "/jobserver/policy && cp " +
      edl::test::SourceDir() + "/scripts/check_layers.sh " + copy + "/scripts/ && cd " + copy +
      " && git init -q . && printf '#include \"jobserver/server.h\"\\n' >jobserver/policy/x.h && "
      "git add jobserver/policy/x.h";
  ASSERT_EQ(std::system(setup.c_str()), 0);
  const std::string bad = "cd " + copy + " && scripts/check_layers.sh >" + out + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(bad.c_str())), 1);
  EXPECT_NE(ReadFile(out).find("jobserver/policy/x.h:1: includes jobserver/server.h"),
            std::string::npos)
      << ReadFile(out);
}

// Bytes from peers are read through the decoders only (scripts/check_json_reads.sh): the tree is
// clean, and the check names a planted read (it can fail).
TEST(ScriptsLintTest, NoJsonReadOutsideTheDecoders) {
  edl::test::ScratchDir dir("edl-json-reads");
  const std::string out = dir.path() + "/out";
  const std::string cmd =
      "cd " + edl::test::SourceDir() + " && scripts/check_json_reads.sh >" + out + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadFile(out);
  const std::string planted = dir.path() + "/planted.cc";
  {
    std::ofstream f(planted);
    f << "#include <nlohmann/json.hpp>\n"
         "int F(const nlohmann::json& peer) {\n"
         "  return peer.value(\"step\", 0);  // reads a peer's field\n"
         "}\n"
         "bool G(const nlohmann::json& m) { return m[\"type\"] == \"x\"; }\n"
         "void H(nlohmann::json& j) { j[\"ok\"] = true; }\n";
  }
  const std::string bad =
      edl::test::SourceDir() + "/scripts/check_json_reads.sh " + planted + " >" + out + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(bad.c_str())), 1);
  const std::string said = ReadFile(out);
  EXPECT_NE(said.find("planted.cc:3:"), std::string::npos) << said;
  EXPECT_NE(said.find("planted.cc:5:"), std::string::npos) << said;
  EXPECT_EQ(said.find("planted.cc:6:"), std::string::npos) << "an assignment builds JSON: " << said;
}

// Every source matches .clang-format and the 100-column limit (scripts/check_format.sh); and the
// check names a file that does not and a line that passes the limit (it can fail).
TEST(ScriptsLintTest, SourcesMatchTheFormatAndTheColumnLimit) {
  edl::test::ScratchDir dir("edl-format");
  const std::string out = dir.path() + "/out";
  const std::string check = edl::test::SourceDir() + "/scripts/check_format.sh";
  EXPECT_EQ(std::system((check + " >" + out + " 2>&1").c_str()), 0) << ReadFile(out);
  const std::string planted = dir.path() + "/planted.cc";
  {
    std::ofstream f(planted);
    f << "int  F( int x ){return x;}\n"
         "const char* kLong = R\"("
      << std::string(100, 'x') << ")\";\n";
  }
  EXPECT_EQ(WEXITSTATUS(std::system((check + " " + planted + " >" + out + " 2>&1").c_str())), 1);
  const std::string said = ReadFile(out);
  EXPECT_NE(said.find("1 of 1 files differ"), std::string::npos) << said;
  EXPECT_NE(said.find("planted.cc:2: 126 columns"), std::string::npos) << said;
}

}  // namespace
}  // namespace edl::launcher
