#include "edl/base/flags.h"

#include <fstream>

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl {
namespace {

struct Argv {
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (auto& s : args) ptrs.push_back(s.data());
  }
  int argc() { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> args;
  std::vector<char*> ptrs;
};

po::options_description Desc() {
  po::options_description d("test");
  d.add_options()("server_port", po::value<int>()->default_value(8180), "port")(
      "node_ips", po::value<std::string>()->default_value("127.0.0.1"), "ips");
  return d;
}

TEST(FlagsTest, FlagsWinOverConfigFile) {
  test::ScratchDir dir;
  std::ofstream(dir.Join("c.ini")) << "# comment\nserver_port = 9000\nnode_ips = 10.0.0.1\n";
  Argv a({"server", "--config", dir.Join("c.ini"), "--server_port=9100"});
  ParsedFlags f;
  ASSERT_OK(ParseFlags("server", "usage", Desc(), a.argc(), a.argv(), &f));
  EXPECT_EQ(f.vm["server_port"].as<int>(), 9100);
  EXPECT_EQ(f.vm["node_ips"].as<std::string>(), "10.0.0.1");
}

TEST(FlagsTest, UnknownKeyInConfigIsNamed) {
  test::ScratchDir dir;
  std::ofstream(dir.Join("c.ini")) << "server_prot = 9000\n";
  Argv a({"server", "--config", dir.Join("c.ini")});
  ParsedFlags f;
  Status s = ParseFlags("server", "usage", Desc(), a.argc(), a.argv(), &f);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("server_prot"), std::string::npos) << s.ToString();
}

// --log_dir that cannot be a directory is refused naming it (the success path changes glog's
// globals and is covered end to end by tests/integration/config_roles_test.cc).
TEST(FlagsTest, UnusableLogDirIsNamed) {
  edl::test::ScratchDir dir("flags-logdir");
  std::ofstream(dir.Join("a-file")) << "x";
  for (const std::string& bad : {dir.Join("a-file"), dir.Join("a-file/sub"), std::string()}) {
    Status s = UseLogDir(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(s.message().find("--log_dir"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(bad), std::string::npos) << s.ToString();
  }
}

TEST(FlagsTest, BadValueAndUnknownFlagAreNamed) {
  ParsedFlags f1, f2;
  Argv a({"server", "--server_port", "eighty"});
  Status s1 = ParseFlags("server", "usage", Desc(), a.argc(), a.argv(), &f1);
  EXPECT_NE(s1.message().find("server_port"), std::string::npos) << s1.ToString();
  Argv b({"server", "--no_such_flag=1"});
  Status s2 = ParseFlags("server", "usage", Desc(), b.argc(), b.argv(), &f2);
  EXPECT_NE(s2.message().find("no_such_flag"), std::string::npos) << s2.ToString();
}

// A word no flag takes is refused, naming it: `--checkpoint_dir /data/ckpt\ dir` split without
// escapes used to leave `dir` behind, silently dropped, and the checkpoints went elsewhere.
TEST(FlagsTest, AStrayWordIsRefusedNamingIt) {
  Argv a({"train", "--node_ips", "/data/ckpt\\", "dir/g2"});
  ParsedFlags f;
  const Status s = ParseFlags("train", "usage", Desc(), a.argc(), a.argv(), &f);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("unexpected argument 'dir/g2'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("quoted"), std::string::npos) << s.ToString();
  // Declared positional arguments still work.
  po::positional_options_description pos;
  pos.add("node_ips", 1);
  Argv b({"ctl", "10.0.0.9"});
  ParsedFlags g;
  ASSERT_OK(ParseFlags("ctl", "usage", Desc(), b.argc(), b.argv(), &g, &pos));
  EXPECT_EQ(g.vm["node_ips"].as<std::string>(), "10.0.0.9");
}

// Boost's guessing took `--server_p 1` as --server_port: an abbreviation is refused, with the
// flag it may have meant.
TEST(FlagsTest, AnAbbreviatedFlagIsRefusedWithTheFlagItMayMean) {
  Argv a({"server", "--server_p", "9000"});
  ParsedFlags f;
  const Status s = ParseFlags("server", "usage", Desc(), a.argc(), a.argv(), &f);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unrecognised option '--server_p'"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("did you mean --server_port?"), std::string::npos) << s.ToString();
  Argv b({"server", "--node_ipz", "x"});  // a typo
  ParsedFlags g;
  EXPECT_NE(
      ParseFlags("server", "usage", Desc(), b.argc(), b.argv(), &g).message().find("--node_ips"),
      std::string::npos);
}

TEST(FlagsTest, SplitCommandLineSplitsAsAShellDoesWithoutExpanding) {
  using V = std::vector<std::string>;
  auto split = [](const std::string& line) {
    auto r = SplitCommandLine(line, "--trainer_cmd");
    EXPECT_TRUE(r.ok()) << line << ": " << r.status().ToString();
    return r.ok() ? r.value() : V{};
  };
  EXPECT_EQ(split("edl train  --epochs 3\t--lr 0.1"),
            (V{"edl", "train", "--epochs", "3", "--lr", "0.1"}));
  EXPECT_EQ(split("edl train --checkpoint_dir /data/ckpt\\ dir/g2"),
            (V{"edl", "train", "--checkpoint_dir", "/data/ckpt dir/g2"}));
  EXPECT_EQ(split("a 'b c' \"d e\" f'g'h"), (V{"a", "b c", "d e", "fgh"}));
  EXPECT_EQ(split("'$HOME \\n' \"\\\" \\$x \\a\""), (V{"$HOME \\n", "\" $x \\a"}));
  EXPECT_EQ(split("a '' b"), (V{"a", "", "b"}));
  EXPECT_EQ(split("   "), V{});
  for (const std::string bad : {"a 'b", "a \"b", "a b\\"}) {
    auto r = SplitCommandLine(bad, "--trainer_cmd");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--trainer_cmd"), std::string::npos)
        << r.status().ToString();
  }
}

}  // namespace
}  // namespace edl
