#include "jobserver/policy/job_spec.h"

#include <gtest/gtest.h>

#include <functional>

#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using nlohmann::json;

JobSpec Valid() {
  JobSpec s;
  EXPECT_OK(
      ParseJobIni("name = a\ntype = resnet\nmin = 1\nmax = 4\npriority = 2\n"
                  "[flags]\nepochs = 3\ncheckpoint_dir = /ckpt/a\n",
                  &s));
  return s;
}

std::map<std::string, JobTypeOffer> Offers() {
  return {{"resnet", {"resnet", {"epochs", "batch", "checkpoint_dir"}}}};
}

TEST(JobSpecTest, ParsesAJobIni) {
  JobSpec s = Valid();
  EXPECT_EQ(s.job.name, "a");
  EXPECT_EQ(s.job.type, "resnet");
  EXPECT_EQ(s.job.min_trainers, 1);
  EXPECT_EQ(s.job.max_trainers, 4);
  EXPECT_EQ(s.job.priority, 2);
  EXPECT_TRUE(s.job.elastic);
  EXPECT_EQ(s.flags.at("epochs"), "3");
  EXPECT_OK(CheckJobSpec(s, Offers(), {}, "/ckpt"));
}

TEST(JobSpecTest, IniRefusesTyposAndMissingSizes) {
  JobSpec s;
  Status st = ParseJobIni("name = a\ntype = t\nmin = 1\nmax = 2\nprioritty = 3\n", &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("prioritty"), std::string::npos) << st.ToString();
  st = ParseJobIni("name = a\ntype = t\nmin = 1\n", &s);
  EXPECT_NE(st.message().find("min and max"), std::string::npos) << st.ToString();
  st = ParseJobIni("name = a\ntype = t\nmin = x\nmax = 2\n", &s);
  EXPECT_NE(st.message().find("'min'"), std::string::npos) << st.ToString();
  st = ParseJobIni("name = a\ntype = t\nmin = 1\nmax = 2\nmode = sometimes\n", &s);
  EXPECT_NE(st.message().find("elastic or restart"), std::string::npos) << st.ToString();
}

TEST(JobSpecTest, WireFormRoundTripsAndIsStrict) {
  const JobSpec s = Valid();
  JobSpec back;
  ASSERT_OK(DecodeJobSpec(EncodeJobSpec(s), &back));
  EXPECT_EQ(EncodeJobSpec(back), EncodeJobSpec(s));

  auto refused = [&](const std::function<void(json*)>& edit, const std::string& expect) {
    json j = EncodeJobSpec(s);
    edit(&j);
    JobSpec out;
    Status st = DecodeJobSpec(j, &out);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << j.dump();
    EXPECT_NE(st.message().find(expect), std::string::npos) << st.ToString();
  };
  refused([](json* j) { (*j)["extra"] = 1; }, "unknown field");
  refused([](json* j) { (*j)["min"] = "1"; }, "'min'");
  refused([](json* j) { (*j)["max"] = 1'000'000; }, "out of range");
  refused([](json* j) { (*j)["name"] = "../x"; }, "job name");
  refused([](json* j) { (*j)["name"] = std::string(200, 'a'); }, "job name");
  refused([](json* j) { (*j)["flags"]["Bad-Flag"] = "1"; }, "flag name");
  refused([](json* j) { (*j)["flags"]["lr"] = std::string(1000, '1'); }, "over 256 bytes");
  refused([](json* j) { (*j)["flags"]["lr"] = "a\nb"; }, "control");
  refused([](json* j) { (*j)["flags"]["lr"] = 0.1; }, "not a string");
  refused(
      [](json* j) {
        for (int i = 0; i < 40; ++i) (*j)["flags"]["f" + std::to_string(i)] = "1";
      },
      "flags; the limit is 32");
  refused([](json* j) { *j = json::array(); }, "not a JSON object");
}

TEST(JobSpecTest, BadSubmissionsAreRefusedWithTheFix) {
  auto check = [](JobSpec s, const std::string& expect) {
    Status st = CheckJobSpec(s, Offers(), {}, "/ckpt");
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(expect), std::string::npos) << st.ToString();
  };
  JobSpec s = Valid();
  s.job.min_trainers = 5;
  check(s, "min 5 > max 4");
  s = Valid();
  s.job.type = "bert";
  check(s, "no node offers job type 'bert'");
  s = Valid();
  s.flags["lr"] = "0.1";
  check(s, "does not declare flag 'lr' settable");
  const std::pair<const char*, const char*> dirs[] = {
      {"/elsewhere/a", "outside the checkpoint root"},
      {"/ckpt/../etc", "'..' component"},
      {"/ckptx/a", "outside the checkpoint root"},
      {"relative/a", "not an absolute path"}};
  for (const auto& [dir, expect] : dirs) {
    s = Valid();
    s.flags["checkpoint_dir"] = dir;
    check(s, expect);
  }
  s = Valid();
  s.job.elastic = false;
  check(s, "fixed size");
  // Without a root no checkpoint_dir may be set.
  Status st = CheckJobSpec(Valid(), Offers(), {}, "");
  EXPECT_NE(st.message().find("no checkpoint root"), std::string::npos) << st.ToString();
  // A type the server was configured with but no node offers yet is accepted (it waits pending).
  s = Valid();
  s.job.type = "bert";
  s.flags.clear();
  EXPECT_OK(CheckJobSpec(s, Offers(), {"bert"}, "/ckpt"));
}

TEST(JobSpecTest, ArgvAppendsFlagsAsSingleArguments) {
  proto::JobInfo info;
  info.flags = {{"epochs", "2"}, {"batch", "8 --evil"}};
  EXPECT_EQ(info.Argv({"edl", "train"}),
            (std::vector<std::string>{"edl", "train", "--batch=8 --evil", "--epochs=2"}));
}

}  // namespace
}  // namespace edl::jobserver
