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

}  // namespace
}  // namespace edl
