// The docs as users read them (docs/TESTING.md, "The docs"):
//  - DocsLinksTest: every relative link of README.md and docs/*.md names a file of this tree, and
//    an `#anchor` a heading of it; no link points out of the tree; every guide is linked from the
//    README.
//  - QuickStartTest: the commands of the README's quick start run as written. The test reads them
//    from README.md (the README is the source of truth), runs them in a scratch directory whose
//    build/ is the tree that built this test, and checks what they print: `edl ctl status` shows
//    the job running on every client's node, `edl ctl scale N` is acknowledged and the job then
//    runs at N, the dashboard's URLs answer 200, `edl ctl stop` ends the job and every process it
//    started exits 0. It waits on what the commands print, never for a fixed time, and stops what
//    it started by pid (itest::Proc). The commands use fixed ports (the server's 8180, the
//    dashboard's), so they run in a network namespace of their own (and a private /tmp, where
//    the clients keep their session files).
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/http_client.h"
#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

namespace fs = std::filesystem;
using itest::Proc;
using itest::Slurp;
using itest::WaitFor;
using std::chrono::milliseconds;

// ---- Markdown, as far as these checks need it

struct Heading {
  int level = 0;
  std::string text;
  size_t line = 0;  // index into the file's lines
};

struct FencedBlock {
  std::string info;  // the word after the opening fence: sh, text, ...
  std::vector<std::string> lines;
  size_t line = 0;  // the opening fence's index
};

struct Markdown {
  std::vector<std::string> lines;
  std::vector<bool> in_code;  // inside a fenced block (fences included)
  std::vector<Heading> headings;
  std::vector<FencedBlock> blocks;
};

bool StartsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

Markdown Parse(const std::string& path) {
  Markdown md;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) md.lines.push_back(l);
  std::optional<FencedBlock> open;
  for (size_t i = 0; i < md.lines.size(); ++i) {
    const std::string t = Trim(md.lines[i]);
    if (StartsWith(t, "```")) {
      md.in_code.push_back(true);
      if (open) {
        md.blocks.push_back(*open);
        open.reset();
      } else {
        open = FencedBlock{Trim(t.substr(3)), {}, i};
      }
      continue;
    }
    md.in_code.push_back(open.has_value());
    if (open) {
      open->lines.push_back(md.lines[i]);
    } else if (StartsWith(md.lines[i], "#")) {
      const size_t n = md.lines[i].find_first_not_of('#');
      if (n != std::string::npos && n <= 6 && md.lines[i][n] == ' ') {
        md.headings.push_back({static_cast<int>(n), Trim(md.lines[i].substr(n)), i});
      }
    }
  }
  return md;
}

// The anchor GitHub gives a heading: lower case, letters, digits, '-' and '_' kept, spaces made
// '-', everything else (punctuation, `code` marks, non-ASCII symbols) dropped; a repeated anchor
// gets -1, -2, ... The docs keep their headings' letters ASCII, so dropping every non-ASCII byte
// is exact for them.
std::set<std::string> Anchors(const Markdown& md) {
  std::set<std::string> out;
  std::map<std::string, int> seen;
  for (const Heading& h : md.headings) {
    std::string a;
    for (unsigned char c : h.text) {
      if (c >= 0x80) continue;
      if (std::isalnum(c)) {
        a += static_cast<char>(std::tolower(c));
      } else if (c == ' ' || c == '-') {
        a += '-';
      } else if (c == '_') {
        a += '_';
      }
    }
    const int n = seen[a]++;
    out.insert(n == 0 ? a : a + "-" + std::to_string(n));
  }
  return out;
}

// The targets of the inline links and images of the lines outside fenced blocks and code spans,
// with their line numbers (1-based).
std::vector<std::pair<size_t, std::string>> Links(const Markdown& md) {
  static const std::regex kLink(R"(!?\[[^\]]*\]\(([^)\s]+)(\s+"[^"]*")?\))");
  std::vector<std::pair<size_t, std::string>> out;
  for (size_t i = 0; i < md.lines.size(); ++i) {
    if (md.in_code[i]) continue;
    std::string l;
    bool span = false;
    for (char c : md.lines[i]) {
      if (c == '`') {
        span = !span;
      } else if (!span) {
        l += c;
      }
    }
    for (auto it = std::sregex_iterator(l.begin(), l.end(), kLink); it != std::sregex_iterator();
         ++it) {
      out.emplace_back(i + 1, (*it)[1].str());
    }
  }
  return out;
}

std::vector<std::string> DocFiles() {
  const fs::path src = test::SourceDir();
  std::vector<std::string> out = {(src / "README.md").string()};
  for (const auto& e : fs::directory_iterator(src / "docs")) {
    if (e.path().extension() == ".md") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(DocsLinksTest, EveryRelativeLinkResolvesToAFileAndHeadingOfThisTree) {
  const fs::path root = fs::canonical(test::SourceDir());
  std::map<std::string, std::set<std::string>> anchors;  // per .md file, parsed when linked
  auto anchors_of = [&](const fs::path& p) -> const std::set<std::string>& {
    const std::string key = fs::canonical(p).string();
    if (anchors.count(key) == 0) anchors[key] = Anchors(Parse(key));
    return anchors[key];
  };
  std::vector<std::string> broken;
  int checked = 0;
  for (const std::string& file : DocFiles()) {
    const Markdown md = Parse(file);
    const std::string rel = fs::relative(file, root).string();
    for (const auto& [line, target] : Links(md)) {
      ++checked;
      const std::string where = rel + ":" + std::to_string(line) + ": " + target;
      if (std::regex_search(target, std::regex("^[a-zA-Z][a-zA-Z0-9+.-]*:"))) {
        // A scheme: only this machine's own addresses (a dashboard the docs start) are allowed.
        if (!std::regex_search(target, std::regex(R"(^https?://(127\.0\.0\.1|localhost)[:/])"))) {
          broken.push_back(where + " (points out of the tree)");
        }
        continue;
      }
      const size_t hash = target.find('#');
      const std::string path = target.substr(0, hash);
      const std::string anchor = hash == std::string::npos ? "" : target.substr(hash + 1);
      const fs::path dest = path.empty() ? fs::path(file) : fs::path(file).parent_path() / path;
      std::error_code ec;
      const fs::path canon = fs::weakly_canonical(dest, ec);
      if (!fs::exists(dest)) {
        broken.push_back(where + " (no such file)");
        continue;
      }
      if (ec || !StartsWith(canon.string(), root.string() + "/")) {
        broken.push_back(where + " (outside the tree)");
        continue;
      }
      if (!anchor.empty()) {
        if (canon.extension() != ".md") {
          broken.push_back(where + " (an anchor into a file that is not Markdown)");
        } else if (anchors_of(canon).count(anchor) == 0) {
          broken.push_back(where + " (no heading with that anchor in " +
                           fs::relative(canon, root).string() + ")");
        }
      }
    }
  }
  EXPECT_GT(checked, 0) << "no links found: is the source tree at " << root << "?";
  std::string list;
  for (const std::string& b : broken) list += "  " + b + "\n";
  EXPECT_TRUE(broken.empty()) << broken.size() << " broken link(s):\n" << list;
}

TEST(DocsLinksTest, EveryGuideIsLinkedFromTheReadme) {
  const fs::path root = test::SourceDir();
  std::set<std::string> linked;
  for (const auto& [line, target] : Links(Parse((root / "README.md").string()))) {
    linked.insert(target.substr(0, target.find('#')));
  }
  for (const std::string& file : DocFiles()) {
    const std::string rel = fs::relative(file, root).string();
    if (rel == "README.md") continue;
    EXPECT_EQ(linked.count(rel), 1u) << rel << " is not linked from README.md";
  }
}

// ---- the quick start

// The README's section whose heading starts with this; its blocks and its prose.
constexpr char kQuickStart[] = "Quick start";

// Commands of the quick start this test does not run, each with the reason. A command matching
// none of these runs; one matching is listed in the test's output as not run, never dropped
// silently. Commands that need ssh, Slurm or a GPU belong here: the quick start is for one
// machine without them, and the ssh and Slurm flows have tests of their own.
struct NotRun {
  const char* pattern;
  const char* reason;
};
const NotRun kNotRun[] = {
    {R"(^make build$)",
     "builds build/; this test runs against the edl of the tree that built it, which stands in "
     "for build/ in its scratch directory"},
    {R"((^|\s)(ssh|scp)\s|ssh_cluster\.sh)",
     "needs other machines over ssh (tests/integration/ssh_cluster_test.cc runs the ssh flow on "
     "network-namespace machines)"},
    {R"((^|\s)(sbatch|srun|salloc)\s)", "needs a Slurm cluster (tests/integration/slurm_test.cc)"},
    {R"(--device[ =](cuda|auto)|--gpus[ =]|nvidia-smi)",
     "needs an NVIDIA GPU (scripts/gpu_check.sh checks the GPU path on a GPU host)"},
};

struct Command {
  std::string text;  // as the shell sees it, without a trailing '&'
  bool background = false;
  size_t line = 0;  // 1-based, in README.md
};

// Removes a trailing `# comment` (a '#' after blank space, outside quotes).
std::string StripComment(const std::string& l) {
  char quote = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    const char c = l[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && (i == 0 || l[i - 1] == ' ' || l[i - 1] == '\t')) {
      return l.substr(0, i);
    }
  }
  return l;
}

// One command per logical line of the block (continuation lines joined).
std::vector<Command> Commands(const FencedBlock& b) {
  std::vector<Command> out;
  std::string pending;
  size_t first = 0;
  for (size_t i = 0; i < b.lines.size(); ++i) {
    std::string l = Trim(b.lines[i]);
    const bool more = !l.empty() && l.back() == '\\';
    if (more) l.pop_back();
    if (pending.empty()) first = b.line + 2 + i;
    l = StripComment(l);
    pending += (pending.empty() ? "" : " ") + Trim(l);
    if (more) continue;
    std::string t = Trim(pending);
    pending.clear();
    if (t.empty()) continue;
    Command c;
    c.line = first;
    if (t.back() == '&' && (t.size() < 2 || t[t.size() - 2] != '&')) {
      c.background = true;
      t = Trim(t.substr(0, t.size() - 1));
    }
    c.text = t;
    out.push_back(c);
  }
  return out;
}

// The value of `flag N` in a command, or -1.
int IntFlag(const std::string& cmd, const std::string& flag) {
  std::smatch m;
  if (std::regex_search(cmd, m, std::regex(flag + R"([ =](\d+))"))) return std::stoi(m[1].str());
  return -1;
}

// The job line of `edl ctl status` as column -> value, from the header that starts with JOB.
std::map<std::string, std::string> JobColumns(const std::string& out) {
  std::istringstream in(out);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    if (!StartsWith(lines[i], "JOB ") || lines[i].find("STATE") == std::string::npos) continue;
    std::istringstream h(lines[i]), v(lines[i + 1]);
    std::map<std::string, std::string> cols;
    for (std::string k, x; h >> k && v >> x;) cols[k] = x;
    return cols;
  }
  return {};
}

// Brings up the loopback interface of this process's (new) network namespace.
bool LoopbackUp() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return false;
  ifreq r{};
  std::strncpy(r.ifr_name, "lo", IFNAMSIZ - 1);
  bool ok = ::ioctl(fd, SIOCGIFFLAGS, &r) == 0;
  r.ifr_flags |= IFF_UP | IFF_RUNNING;
  ok = ok && ::ioctl(fd, SIOCSIFFLAGS, &r) == 0;
  ::close(fd);
  return ok;
}

// Moves this test process (and so every process it starts) into a network namespace of its own,
// where the quick start's fixed ports are free whatever else runs on the machine, with a private
// /tmp where one can be mounted. "" or why not.
std::string Isolate() {
  if (::unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) {
    return std::string("unshare(CLONE_NEWNET | CLONE_NEWNS): ") + std::strerror(errno) +
           " (needs root: the quick start's commands use fixed ports, which other tests and users "
           "of this machine may hold)";
  }
  if (!LoopbackUp())
    return std::string("cannot bring up lo in the new network namespace: ") + std::strerror(errno);
  // A private /tmp: the clients keep their session files and sockets there (/tmp/edl-<node>...).
  // Best effort: the quick start runs the same without it. Not with EDL_KEEP_TEST_DIRS, whose
  // scratch directory must outlive the namespace, nor when the tree (the source or the build)
  // lies under /tmp, which the mount would hide.
  auto under_tmp = [](const std::string& p) {
    return fs::absolute(p).string().rfind("/tmp/", 0) == 0;
  };
  if (std::getenv("EDL_KEEP_TEST_DIRS") == nullptr && !under_tmp(test::SourceDir()) &&
      !under_tmp(test::BuildDir()) &&
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0) {
    if (::mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777") != 0) {
      std::cerr << "docs_test: no private /tmp (" << std::strerror(errno)
                << "); using the shared one\n";
    }
  }
  return "";
}

class QuickStartTest : public ::testing::Test {
 protected:
  // The quick start section: its fenced blocks and the URLs of its prose.
  void ReadSection() {
    const Markdown md = Parse(test::SourceDir() + "/README.md");
    size_t from = md.lines.size(), to = md.lines.size();
    int level = 0;
    for (const Heading& h : md.headings) {
      if (from == md.lines.size()) {
        if (StartsWith(h.text, kQuickStart)) {
          from = h.line;
          level = h.level;
        }
      } else if (h.level <= level) {
        to = h.line;
        break;
      }
    }
    ASSERT_LT(from, md.lines.size())
        << "README.md has no heading starting with '" << kQuickStart << "'";
    for (const FencedBlock& b : md.blocks) {
      if (b.line <= from || b.line >= to) continue;
      if (b.info == "sh" || b.info == "bash" || b.info == "shell") {
        for (const Command& c : Commands(b)) commands_.push_back(c);
      } else if (b.info.empty()) {
        ADD_FAILURE()
            << "README.md:" << b.line + 1 << ": a block of the quick start without an info "
            << "string: mark commands ```sh and output ```text, so that this test knows which "
            << "to run";
      }
    }
    static const std::regex kUrl(R"(http://(127\.0\.0\.1|localhost):(\d+)(/[^\s)`'"<>]*)?)");
    for (size_t i = from; i < to; ++i) {
      if (md.in_code[i]) continue;
      for (auto it = std::sregex_iterator(md.lines[i].begin(), md.lines[i].end(), kUrl);
           it != std::sregex_iterator(); ++it) {
        std::string path = (*it)[3].matched ? (*it)[3].str() : "/";
        while (path.size() > 1 && (path.back() == '.' || path.back() == ',' || path.back() == ';'))
          path.pop_back();
        urls_.insert({std::stoi((*it)[2].str()), path});
      }
    }
  }

  std::string Shell(const std::string& cmd) const { return prelude_ + cmd; }

  // Runs `cmd` to completion (bounded, for a hung command); its exit code and output.
  int Run(const std::string& cmd, std::string* out) {
    const std::string log = dir_->Join("cmd-" + std::to_string(++runs_) + ".log");
    const int rc = itest::RunCommand({"/bin/bash", "-c", Shell(cmd)}, log, milliseconds(120000));
    *out = Slurp(log);
    return rc;
  }

  // Fails when a process the quick start left running has ended: waiting further would only
  // time out.
  std::string Ended() {
    for (auto& [cmd, p] : background_) {
      if (!p->Running())
        return "`" + cmd + "` ended; its log " + p->log() + ":\n" + Slurp(p->log(), 3000);
    }
    return "";
  }

  // The ends of the logs of what the quick start started: its processes' own output, and the
  // log files its commands redirect to or the processes write (server.log, edl-logs/...).
  std::string Logs() {
    std::string out;
    for (auto& [cmd, p] : background_)
      out += "\n--- " + cmd + " (" + p->log() + "):\n" + Slurp(p->log(), 2000);
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir_->path(), ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (it->is_regular_file(ec) && it->path().extension() == ".log" &&
          !StartsWith(name, "cmd-") && !StartsWith(name, "bg-")) {
        out += "\n--- " + it->path().string() + ":\n" + Slurp(it->path().string(), 1500);
      }
    }
    return out;
  }

  void CheckUrls() {
    urls_checked_ = true;
    for (const auto& [port, path] : urls_) {
      const test::HttpReply r = test::HttpGet("127.0.0.1", port, path);
      EXPECT_EQ(r.status, 200) << "http://127.0.0.1:" << port << path << ": " << r.error << Logs();
      EXPECT_FALSE(r.body.empty()) << "http://127.0.0.1:" << port << path;
      std::cout << "docs_test: http://127.0.0.1:" << port << path << " answered " << r.status
                << " (" << r.body.size() << " bytes)\n";
    }
  }

  std::vector<Command> commands_;
  std::set<std::pair<int, std::string>> urls_;
  std::optional<test::ScratchDir> dir_;
  std::string prelude_;
  int runs_ = 0;
  bool urls_checked_ = false;
  std::vector<std::pair<std::string, std::unique_ptr<Proc>>> background_;
};

TEST_F(QuickStartTest, CommandsRunAsWritten) {
  ASSERT_NO_FATAL_FAILURE(ReadSection());
  ASSERT_FALSE(commands_.empty()) << "the quick start has no ```sh block";

  // What the quick start must show, so that it cannot lose a step unnoticed.
  int clients = 0, world = 0;
  bool has_status = false, has_scale = false, has_stop = false, trains = false;
  for (const Command& c : commands_) {
    if (c.background && std::regex_search(c.text, std::regex(R"(\bedl client\b)"))) {
      ++clients;
      world += std::max(0, IntFlag(c.text, "--slots"));
    }
    has_status |= std::regex_search(c.text, std::regex(R"(\bctl\b.*\bstatus\b)"));
    has_scale |= std::regex_search(c.text, std::regex(R"(\bctl\b.*\bscale\s+\d+)"));
    has_stop |= std::regex_search(c.text, std::regex(R"(\bctl\b.*\bstop\b)"));
    trains |= c.text.find(" train") != std::string::npos;
  }
  EXPECT_GE(clients, 2) << "the quick start starts fewer than two `edl client`s";
  EXPECT_TRUE(has_status) << "the quick start shows no `edl ctl status`";
  EXPECT_TRUE(has_scale) << "the quick start shows no `edl ctl scale N`";
  EXPECT_TRUE(has_stop) << "the quick start shows no `edl ctl stop`";
  EXPECT_FALSE(urls_.empty())
      << "the quick start names no http://127.0.0.1:PORT/ address (the dashboard)";
  if (HasFailure()) return;
  if (trains && !fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist "
                 << "(apt-get install dataset-fashion-mnist; scripts/install_deps.sh does)";
  }

  const std::string why = Isolate();
  if (!why.empty()) GTEST_SKIP() << "the quick start is not run: " << why;

  // The scratch directory plays the checkout: its build/ is the tree that built this test.
  dir_.emplace("edl-quickstart");
  fs::create_directory_symlink(fs::absolute(test::BuildDir()), dir_->Join("build"));
  for (const char* d : {"config", "scripts", "examples"}) {
    fs::create_directory_symlink(fs::path(test::SourceDir()) / d, dir_->Join(d));
  }
  prelude_ = "set -e; cd '" + dir_->path() + "'; ";

  for (const Command& c : commands_) {
    SCOPED_TRACE("README.md:" + std::to_string(c.line) + ": " + c.text);
    const NotRun* skip = nullptr;
    for (const NotRun& n : kNotRun) {
      if (std::regex_search(c.text, std::regex(n.pattern))) skip = &n;
    }
    if (skip != nullptr) {
      std::cout << "docs_test: not run: README.md:" << c.line << ": " << c.text << "\n  because it "
                << skip->reason << "\n";
      continue;
    }
    std::cout << "docs_test: README.md:" << c.line << ": " << c.text << (c.background ? " &" : "")
              << "\n";
    if (c.background) {
      const std::string log = dir_->Join("bg-" + std::to_string(background_.size() + 1) + ".log");
      background_.emplace_back(
          c.text, std::make_unique<Proc>(
                      std::vector<std::string>{"/bin/bash", "-c", Shell("exec " + c.text)}, log));
      continue;
    }
    const bool status = std::regex_search(c.text, std::regex(R"(\bctl\b.*\bstatus\b)"));
    const bool stop = std::regex_search(c.text, std::regex(R"(\bctl\b.*\bstop\b)"));
    std::smatch scale;
    const bool scales =
        std::regex_search(c.text, scale, std::regex(R"(\bctl\b.*\bscale\s+(\d+)\s*$)"));
    std::string out;
    if (status) {
      // Until the job runs on every client's node at the size asked for: the clients connect and
      // the trainers start after the commands that started them returned.
      std::map<std::string, std::string> cols;
      std::string ended;
      const bool ran = WaitFor(
          [&] {
            ended = Ended();
            if (!ended.empty()) return true;
            cols = Run(c.text, &out) == 0 ? JobColumns(out) : std::map<std::string, std::string>{};
            // A job that fails or has finished will not get there: no point in waiting on.
            return cols["STATE"] == "failing" || cols["STATE"] == "finished" ||
                   (cols["STATE"] == "running" && cols["NODES"] == std::to_string(clients) &&
                    cols["WORLD"] == std::to_string(world));
          },
          milliseconds(600000));
      ASSERT_TRUE(ended.empty()) << ended;
      ASSERT_EQ(cols["STATE"], "running") << out << Logs();
      ASSERT_TRUE(ran) << "the job did not run on " << clients << " nodes at world size " << world
                       << "; the last status:\n"
                       << out << Logs();
      std::cout << out;
    } else if (stop) {
      if (!urls_checked_) CheckUrls();
      ASSERT_EQ(Run(c.text, &out), 0) << out << Logs();
      EXPECT_NE(out.find("job stopped"), std::string::npos) << out;
      std::cout << out;
      for (auto& [cmd, p] : background_) {
        EXPECT_EQ(p->Wait(milliseconds(300000)), 0)
            << "`" << cmd << "` after `edl ctl stop`; its log " << p->log() << ":\n"
            << Slurp(p->log(), 3000);
      }
    } else {
      ASSERT_EQ(Run(c.text, &out), 0) << out << Logs();
      if (scales) {
        world = std::stoi(scale[1].str());
        EXPECT_NE(out.find("desired size set to " + std::to_string(world)), std::string::npos)
            << out;
        std::cout << out;
      }
      // A line that changes the shell's state (cd, export) holds for the lines after it, as in the
      // reader's shell: it runs again in front of each (so it must be idempotent, as mkdir -p is).
      if (std::regex_search(c.text, std::regex(R"((^|[;&|]\s*)(cd|export)\s)")))
        prelude_ += c.text + "; ";
    }
  }
  if (!urls_checked_) CheckUrls();
  // Whatever still runs (a quick start without a stop) is stopped by pid when background_ goes:
  // SIGTERM, and each must exit 0 (itest::Proc).
}

}  // namespace
}  // namespace edl
