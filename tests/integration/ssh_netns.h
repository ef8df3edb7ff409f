// SshNetns: machines for tests of the ssh paths (scripts/ssh_cluster.sh) with a real sshd. Each
// machine is a network namespace on one LAN: a bridge in a hub namespace, one veth per machine,
//
//   hub (bridge br0, 10.<net>.0.1/24; the operator's ssh runs here)
//     +-- veth -- machine "a" 10.<net>.0.2/24   sshd on :22
//     +-- veth -- machine "b" 10.<net>.0.3/24   sshd on :22   ...
//
// Every sshd belongs to the test: started (by pid, in the foreground) with a config, host key and
// authorized_keys the test generated in its scratch directory, and `SetEnv HOME=<dir>/home-<name>`,
// so each machine has a home of its own (its own ~/.edl/secret) and nothing touches the real one.
// Machines share the file system and the pid space (one checkout at the same path everywhere, as
// the scripts assume; a pid seen anywhere is the test's to check). Nothing appears in the host's
// network namespace: deleting the namespaces removes the links. Needs root, iproute2, sshd, ssh
// and ssh-keygen; WhyUnsupported names what is missing.
//
// Thread-safety: none; one test thread.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/process_util.h"

namespace edl::itest {

class SshNetns {
 public:
  static constexpr char kIp[] = "/usr/sbin/ip";
  static constexpr char kSshd[] = "/usr/sbin/sshd";
  static constexpr char kSsh[] = "/usr/bin/ssh";
  static constexpr char kKeygen[] = "/usr/bin/ssh-keygen";

  // `dir`: the test's scratch directory (keys, configs, homes, logs); `names`: the machines.
  SshNetns(std::string dir, std::vector<std::string> names) : dir_(std::move(dir)) {
    const std::string tag = "edlssh-" + std::to_string(::getpid()) + "-";
    hub_ = tag + "hub";
    int i = 1;
    for (const std::string& n : names) {
      Machine m;
      m.ns = tag + n;
      m.addr = "10.241.0." + std::to_string(++i);
      m.home = dir_ + "/home-" + n;
      machines_[n] = std::move(m);
      order_.push_back(n);
    }
  }
  ~SshNetns() {
    for (auto& [name, m] : machines_) m.sshd.reset();  // SIGTERM by pid, then SIGKILL
    for (const std::string& ns : created_) RunCommand({kIp, "netns", "delete", ns}, Log());
  }
  SshNetns(const SshNetns&) = delete;
  SshNetns& operator=(const SshNetns&) = delete;

  // Why this machine cannot run the tests, or "".
  static std::string WhyUnsupported(const std::string& log) {
    if (::geteuid() != 0) return "needs root to create network namespaces and run sshd";
    for (const char* bin : {kIp, kSshd, kSsh, kKeygen}) {
      if (::access(bin, X_OK) != 0) {
        return std::string(bin) +
               " not found (apt-get install iproute2 openssh-server openssh-client)";
      }
    }
    if (RunCommand({kIp, "netns", "list"}, log) != 0) return "`ip netns list` failed; see " + log;
    return "";
  }

  // Creates keys, namespaces, the bridge and links, and starts every sshd; waits until each
  // answers an ssh login. "" or the first failure with its log.
  std::string Build() {
    std::filesystem::create_directories(dir_);
    std::filesystem::create_directories("/run/sshd");  // sshd's privilege-separation directory
    if (!Run({kKeygen, "-q", "-t", "ed25519", "-N", "", "-f", dir_ + "/host_key"}) ||
        !Run({kKeygen, "-q", "-t", "ed25519", "-N", "", "-f", dir_ + "/user_key"})) {
      return Failed("ssh-keygen");
    }
    std::filesystem::copy_file(dir_ + "/user_key.pub", dir_ + "/authorized_keys");
    if (!Add(hub_) || !Run({kIp, "-n", hub_, "link", "set", "lo", "up"}) ||
        !Run({kIp, "-n", hub_, "link", "add", "br0", "type", "bridge"}) ||
        !Run({kIp, "-n", hub_, "addr", "add", "10.241.0.1/24", "dev", "br0"}) ||
        !Run({kIp, "-n", hub_, "link", "set", "br0", "up"})) {
      return Failed("the hub namespace " + hub_);
    }
    int i = 0;
    for (const std::string& name : order_) {
      Machine& m = machines_[name];
      m.port_if = "p" + std::to_string(++i);
      if (!Add(m.ns) ||
          !Run({kIp, "link", "add", m.port_if, "netns", hub_, "type", "veth", "peer", "name",
                "eth0", "netns", m.ns}) ||
          !Run({kIp, "-n", hub_, "link", "set", m.port_if, "master", "br0"}) ||
          !Run({kIp, "-n", hub_, "link", "set", m.port_if, "up"}) ||
          !Run({kIp, "-n", m.ns, "addr", "add", m.addr + "/24", "dev", "eth0"}) ||
          !Run({kIp, "-n", m.ns, "link", "set", "eth0", "up"}) ||
          !Run({kIp, "-n", m.ns, "link", "set", "lo", "up"})) {
        return Failed("machine " + name + " (" + m.ns + ")");
      }
      std::filesystem::create_directories(m.home);
      const std::string conf = dir_ + "/sshd-" + name + ".conf";
      std::ofstream(conf) << "ListenAddress " << m.addr << ":22\n"
                          << "HostKey " << dir_ << "/host_key\n"
                          << "AuthorizedKeysFile " << dir_ << "/authorized_keys\n"
                          << "PidFile none\nStrictModes no\nUsePAM no\n"
                          << "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                          << "KbdInteractiveAuthentication no\nLogLevel ERROR\n"
                          << "SetEnv HOME=" << m.home << "\n";
      m.sshd = std::make_unique<Proc>(
          std::vector<std::string>{kIp, "netns", "exec", m.ns, kSshd, "-D", "-e", "-f", conf},
          dir_ + "/sshd-" + name + ".log");
    }
    for (const std::string& name : order_) {
      const bool up = WaitFor(
          [&] {
            std::vector<std::string> argv = SshArgv();
            argv.push_back(Target(name));
            argv.push_back("true");
            return RunCommand(argv, Log()) == 0;
          },
          milliseconds(60000));
      if (!up)
        return Failed("sshd of " + name +
                      " did not accept a login: " + Slurp(dir_ + "/sshd-" + name + ".log"));
    }
    return "";
  }

  // ssh as the operator runs it: in the hub namespace, with the test's key and known_hosts.
  std::vector<std::string> SshArgv() const {
    return {kIp,
            "netns",
            "exec",
            hub_,
            kSsh,
            "-F",
            "/dev/null",
            "-i",
            dir_ + "/user_key",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "UserKnownHostsFile=" + dir_ + "/known_hosts",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5"};
  }
  // EDL_SSH and EDL_SSH_OPTS for scripts/ssh_cluster.sh.
  std::map<std::string, std::string> ScriptEnv() const {
    const std::vector<std::string> argv = SshArgv();
    std::string ssh, opts;
    for (size_t i = 0; i < 5; ++i) ssh += (i ? " " : "") + argv[i];
    for (size_t i = 5; i < argv.size(); ++i) opts += (i > 5 ? " " : "") + argv[i];
    return {{"EDL_SSH", ssh}, {"EDL_SSH_OPTS", opts}};
  }
  // The ssh target of machine `name` (root@ADDRESS).
  std::string Target(const std::string& name) const { return "root@" + machines_.at(name).addr; }
  const std::string& Addr(const std::string& name) const { return machines_.at(name).addr; }
  const std::string& Home(const std::string& name) const { return machines_.at(name).home; }
  // argv prefix running a command on machine `name` (in its namespace).
  std::vector<std::string> Exec(const std::string& name) const {
    return {kIp, "netns", "exec", machines_.at(name).ns};
  }
  // Takes machine `name`'s link down (up) at the bridge: a cut cable, nothing reaches either side.
  bool SetLink(const std::string& name, bool up) {
    return Run({kIp, "-n", hub_, "link", "set", machines_.at(name).port_if, up ? "up" : "down"});
  }
  // Pids of the test's sshd processes (masters), to leave out of process checks.
  std::vector<int> SshdPids() const {
    std::vector<int> pids;
    for (const auto& [name, m] : machines_) {
      if (m.sshd) pids.push_back(m.sshd->pid());
    }
    return pids;
  }

 private:
  struct Machine {
    std::string ns, addr, home, port_if;
    std::unique_ptr<Proc> sshd;
  };
  std::string Log() const { return dir_ + "/netns.log"; }
  bool Run(const std::vector<std::string>& argv) { return RunCommand(argv, Log()) == 0; }
  bool Add(const std::string& ns) {
    if (!Run({kIp, "netns", "add", ns})) return false;
    created_.push_back(ns);
    return true;
  }
  std::string Failed(const std::string& what) { return what + " failed: " + Slurp(Log(), 4000); }

  const std::string dir_;
  std::string hub_;
  std::map<std::string, Machine> machines_;
  std::vector<std::string> order_;
  std::vector<std::string> created_;
};

// "pid: command line" of every process other than this one and `except` whose command line or
// environment mentions `dir` (a test's scratch directory): what a test left running.
inline std::vector<std::string> ProcessesMentioning(const std::string& dir,
                                                    const std::vector<int>& except) {
  std::vector<std::string> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == ::getpid()) continue;
    bool skip = false;
    for (int p : except) skip = skip || p == pid;
    if (skip) continue;
    const std::string base = std::string("/proc/") + e->d_name;
    std::string cmdline = Slurp(base + "/cmdline"), environ = Slurp(base + "/environ");
    if (cmdline.empty()) continue;  // a kernel thread, or a zombie: nothing runs
    if (cmdline.find(dir) == std::string::npos && environ.find(dir) == std::string::npos) continue;
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    out.push_back(std::string(e->d_name) + ": " + cmdline);
  }
  ::closedir(proc);
  return out;
}

}  // namespace edl::itest
