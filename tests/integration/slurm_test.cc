// scripts/slurm/edl.sbatch on a real single-node Slurm: the test starts munged, slurmctld and
// slurmd (Debian's munge and slurm-wlm) as root from a generated slurm.conf in a scratch directory,
// submits the script with `sbatch --wait` and stand-in trainers, and checks that the job's server
// formed one generation of the node's slots, every trainer finished, and the job exited 0. Skipped
// with the reason where the daemons cannot run (not root, packages missing, a daemon that exits).
// Every daemon is stopped by pid; a job left behind is cancelled first.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

namespace fs = std::filesystem;
using itest::FreePort;
using itest::json;
using itest::Proc;
using itest::ReadLines;
using itest::RunCommand;
using itest::Slurp;
using itest::WaitFor;
using std::chrono::milliseconds;

std::string ShortHostName() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  std::string h = buf;
  return h.substr(0, h.find('.'));
}

class SlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the test starts slurmctld, slurmd and munged as root";
    for (const char* tool :
         {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch",
          "/usr/bin/sinfo", "/usr/bin/scancel", "/usr/bin/squeue"}) {
      if (!fs::exists(tool)) {
        GTEST_SKIP()
            << tool
            << " is not installed (apt-get install slurm-wlm munge; scripts/install_deps.sh does)";
      }
    }
    host_ = ShortHostName();
    env_ = {{"SLURM_CONF", dir_.Join("slurm.conf")}};
    fs::create_directories(dir_.Join("state"));
    fs::create_directories(dir_.Join("spool"));
    fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read |
                                     fs::perms::group_exec | fs::perms::others_read |
                                     fs::perms::others_exec);
    // munge: a key of its own and a socket in the scratch directory (no system munged needed).
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string key(1024, '\0');
      random.read(key.data(), key.size());
      std::ofstream(dir_.Join("munge.key"), std::ios::binary) << key;
    }
    fs::permissions(dir_.Join("munge.key"), fs::perms::owner_read);
    const std::string socket = dir_.Join("munge.sock");
    munged_ = std::make_unique<Proc>(
        std::vector<std::string>{
            "/usr/sbin/munged", "--foreground", "--force", "--socket=" + socket,
            "--key-file=" + dir_.Join("munge.key"), "--pid-file=" + dir_.Join("munged.pid"),
            "--log-file=" + dir_.Join("munged.log"), "--seed-file=" + dir_.Join("munge.seed")},
        dir_.Join("munged.out"));
    if (!WaitFor([&] { return fs::exists(socket) || munged_->Wait(milliseconds(0)) >= 0; },
                 milliseconds(30000)) ||
        !fs::exists(socket)) {
      GTEST_SKIP() << "munged did not start: " << Slurp(dir_.Join("munged.out"), 2000)
                   << Slurp(dir_.Join("munged.log"), 2000);
    }
    const unsigned cpus = std::max(2u, std::thread::hardware_concurrency());
    std::ofstream(dir_.Join("slurm.conf"))
        << "ClusterName=edltest\n"
        << "SlurmctldHost=" << host_ << "(127.0.0.1)\n"
        << "SlurmctldPort=" << FreePort() << "\nSlurmdPort=" << FreePort() << "\n"
        << "SlurmUser=root\nSlurmdUser=root\n"
        << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << socket << "\n"
        << "StateSaveLocation=" << dir_.Join("state") << "\nSlurmdSpoolDir=" << dir_.Join("spool")
        << "\n"
        << "SlurmctldPidFile=" << dir_.Join("slurmctld.pid")
        << "\nSlurmdPidFile=" << dir_.Join("slurmd.pid") << "\n"
        << "SlurmctldLogFile=" << dir_.Join("slurmctld.log")
        << "\nSlurmdLogFile=" << dir_.Join("slurmd.log") << "\n"
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
        << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nReturnToService=2\n"
        << "JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n"
        << "JobAcctGatherType=jobacct_gather/none\nSlurmdTimeout=60\nInactiveLimit=0\nKillWait=5\n"
        << "NodeName=" << host_ << " NodeAddr=127.0.0.1 CPUs=" << cpus
        << " RealMemory=1000 State=UNKNOWN\n"
        << "PartitionName=edl Nodes=" << host_ << " Default=YES MaxTime=INFINITE State=UP\n";
    slurmctld_ = std::make_unique<Proc>(
        std::vector<std::string>{"/usr/sbin/slurmctld", "-D", "-i", "-f", dir_.Join("slurm.conf")},
        dir_.Join("slurmctld.out"), env_);
    slurmd_ = std::make_unique<Proc>(std::vector<std::string>{"/usr/sbin/slurmd", "-D", "-f",
                                                              dir_.Join("slurm.conf"), "-N", host_},
                                     dir_.Join("slurmd.out"), env_);
    // The node is up once sinfo shows it idle.
    const bool idle = WaitFor(
        [&] {
          if (slurmctld_->Wait(milliseconds(0)) >= 0 || slurmd_->Wait(milliseconds(0)) >= 0)
            return true;
          RunCommand({"/usr/bin/env", "SLURM_CONF=" + dir_.Join("slurm.conf"), "/usr/bin/sinfo",
                      "-h", "-o", "%t"},
                     dir_.Join("sinfo.out"), milliseconds(20000));
          const std::string state = Slurp(dir_.Join("sinfo.out"));
          fs::remove(dir_.Join("sinfo.out"));
          return state.rfind("idle", 0) == 0;
        },
        milliseconds(90000));
    if (!idle || slurmctld_->Wait(milliseconds(0)) >= 0 || slurmd_->Wait(milliseconds(0)) >= 0) {
      GTEST_SKIP() << "Slurm did not come up on this machine:\n"
                   << Slurp(dir_.Join("slurmctld.out"), 1500)
                   << Slurp(dir_.Join("slurmctld.log"), 1500)
                   << Slurp(dir_.Join("slurmd.out"), 1500) << Slurp(dir_.Join("slurmd.log"), 1500);
    }
  }

  // Cancels whatever job is left, then stops the daemons by pid (Proc's destructor).
  void TearDown() override {
    if (slurmctld_ != nullptr && slurmctld_->Wait(milliseconds(0)) < 0) {
      RunCommand({"/usr/bin/env", "SLURM_CONF=" + dir_.Join("slurm.conf"), "/usr/bin/scancel",
                  "--partition=edl"},
                 dir_.Join("scancel.out"), milliseconds(20000));
      WaitFor(
          [&] {
            RunCommand(
                {"/usr/bin/env", "SLURM_CONF=" + dir_.Join("slurm.conf"), "/usr/bin/squeue", "-h"},
                dir_.Join("squeue.out"), milliseconds(20000));
            const bool empty = Slurp(dir_.Join("squeue.out")).empty();
            fs::remove(dir_.Join("squeue.out"));
            return empty;
          },
          milliseconds(60000));
    }
    slurmd_.reset();
    slurmctld_.reset();
    munged_.reset();
  }

  std::string Diagnostics() {
    return "job.out:\n" + Slurp(dir_.Join("job.out"), 3000) + "\nserver.out:\n" +
           Slurp(dir_.Join("run/logs/server.out"), 3000) + "\nslurmd.log:\n" +
           Slurp(dir_.Join("slurmd.log"), 2000);
  }

  test::ScratchDir dir_{"edl-slurm"};
  std::string host_;
  std::map<std::string, std::string> env_;
  std::unique_ptr<Proc> munged_, slurmctld_, slurmd_;
};

TEST_F(SlurmTest, SbatchRunsServerAndOneClientPerNodeUntilTheTrainersFinish) {
  const std::string records = dir_.Join("records.jsonl");
  const std::string port = std::to_string(FreePort());
  Proc sbatch(
      {"/usr/bin/env", "SLURM_CONF=" + dir_.Join("slurm.conf"), "EDL_BIN=" + test::EdlBinary(),
       "EDL_RUN_DIR=" + dir_.Join("run"), "EDL_SLOTS=2", "EDL_SERVER_PORT=" + port,
       "EDL_SERVER_ADDR=127.0.0.1", "STANDIN_RECORD=" + records, "STANDIN_EXIT_AFTER_MS=2000",
       "/usr/bin/sbatch", "--wait", "--nodes=1", "--output=" + dir_.Join("job.out"),
       "--chdir=" + dir_.path(), test::SourceDir() + "/scripts/slurm/edl.sbatch", STAND_IN_TRAINER},
      dir_.Join("sbatch.out"));
  ASSERT_EQ(sbatch.Wait(milliseconds(300000)), 0)
      << Slurp(dir_.Join("sbatch.out")) << Diagnostics();
  const std::string out = Slurp(dir_.Join("job.out"));
  EXPECT_NE(out.find("edl.sbatch: server 127.0.0.1:" + port), std::string::npos) << out;
  EXPECT_NE(out.find("clients exited with status 0"), std::string::npos) << out;

  // Two trainers (EDL_SLOTS=2 on the one node), in one generation of world 2, both finished.
  int started = 0, finished = 0;
  for (const json& r : ReadLines(records)) {
    if (r["event"] == "start") {
      ++started;
      EXPECT_EQ(r["world_size"], 2) << r.dump();
    }
    finished += r["event"] == "finished" ? 1 : 0;
  }
  EXPECT_EQ(started, 2) << Slurp(records) << Diagnostics();
  EXPECT_EQ(finished, 2) << Slurp(records) << Diagnostics();
  std::string events_file;
  for (const auto& e : fs::directory_iterator(dir_.Join("run/events")))
    events_file = e.path().string();
  ASSERT_FALSE(events_file.empty()) << Diagnostics();
  bool job_finished = false;
  for (const json& e : ReadLines(events_file)) job_finished |= e["type"] == "finished";
  EXPECT_TRUE(job_finished) << Slurp(events_file, 3000);
  // The job's secret is removed from the node when the job ends.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(\(job slurm-(\d+)\))"))) << out;
  EXPECT_FALSE(fs::exists("/tmp/edl-" + m[1].str() + ".secret"))
      << "the job's secret was left behind";
}

}  // namespace
}  // namespace edl
