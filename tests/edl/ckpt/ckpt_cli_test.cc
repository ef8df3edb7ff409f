// `edl ckpt ls|verify|export` run as a real process on a real store.
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "edl/ckpt/checkpoint_store.h"
#include "edl/ckpt/crc32c.h"
#include "tests/testutil.h"

namespace edl::ckpt {
namespace {

namespace fs = std::filesystem;

// Runs `edl ckpt ARGS` and returns its exit code; *out gets stdout. Its stderr goes to the test's
// output (ctest fails a test whose output holds a sanitizer report: tests/CMakeLists.txt).
int RunEdl(const std::string& args, std::string* out) {
  FILE* p = popen((test::EdlBinary() + " ckpt " + args).c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  out->clear();
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class CkptCliTest : public testing::Test {
 protected:
  void SetUp() override {
    RocksDbStoreOptions o;
    o.dir = dir_.Join("store");
    store_ = OpenRocksDbStore(o);
    for (int i = 0; i < 2; ++i) {
      std::vector<float>& w = weights_[i];
      w.resize(300000);
      for (size_t k = 0; k < w.size(); ++k) w[k] = static_cast<float>(k * (i + 1)) * 0.5f;
      std::vector<TensorView> views = {
          {"fc.weight", DataType::kFloat32, {600, 500}, w.data(), w.size() * 4},
          {"fc.bias", DataType::kFloat32, {3}, bias_, sizeof(bias_)}};
      CheckpointMeta m;
      m.step = 100 * (i + 1);
      m.generation = 4;
      m.world_size = 2;
      m.fingerprint = "fp";
      ASSERT_OK(store_->Save(m, views, nullptr));
    }
  }
  test::ScratchDir dir_{"ckpt-cli"};
  std::unique_ptr<CheckpointStore> store_;
  std::vector<float> weights_[2];
  float bias_[3] = {1, 2, 3};
};

TEST_F(CkptCliTest, LsListsCheckpointsAsTableAndJson) {
  std::string out;
  ASSERT_EQ(RunEdl("ls --checkpoint_dir " + dir_.Join("store"), &out), 0) << out;
  EXPECT_NE(out.find("generation"), std::string::npos) << out;
  EXPECT_NE(out.find("200"), std::string::npos) << out;
  ASSERT_EQ(RunEdl("ls --json --checkpoint_dir " + dir_.Join("store"), &out), 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1]["step"], 200);
  EXPECT_EQ(j[1]["generation"], 4);
  EXPECT_EQ(j[1]["bytes"], 300000 * 4 + 12);
}

TEST_F(CkptCliTest, VerifyNamesTheCorruptTensorAndFails) {
  std::string out;
  ASSERT_EQ(RunEdl("verify --checkpoint_dir " + dir_.Join("store"), &out), 0) << out;
  // Flip one byte inside checkpoint 2's fc.weight, wherever it lies in the SST files.
  const std::string pattern(reinterpret_cast<const char*>(weights_[1].data() + 1000), 64);
  bool flipped = false;
  for (const auto& e : fs::directory_iterator(dir_.Join("store"))) {
    if (e.path().extension() != ".sst" || flipped) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t pos = content.find(pattern);
    if (pos == std::string::npos) continue;
    f.clear();
    f.seekp(static_cast<std::streamoff>(pos + 5));
    const char c = static_cast<char>(content[pos + 5] ^ 1);
    f.write(&c, 1);
    flipped = true;
  }
  ASSERT_TRUE(flipped);
  EXPECT_EQ(RunEdl("verify --id 2 --checkpoint_dir " + dir_.Join("store"), &out), 1) << out;
  EXPECT_NE(out.find("fc.weight"), std::string::npos) << out;
  EXPECT_EQ(RunEdl("verify --id 1 --checkpoint_dir " + dir_.Join("store"), &out), 0) << out;
}

TEST_F(CkptCliTest, ExportWritesRawFilesAndIndex) {
  std::string out;
  const std::string dst = dir_.Join("export");
  ASSERT_EQ(RunEdl("export --id 1 --out " + dst + " --checkpoint_dir " + dir_.Join("store"), &out),
            0)
      << out;
  std::ifstream in(dst + "/index.json");
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["step"], 100);
  ASSERT_EQ(index["tensors"].size(), 2u);
  const auto& t = index["tensors"][0];
  EXPECT_EQ(t["name"], "fc.weight");
  EXPECT_EQ(t["dtype"], "float32");
  EXPECT_EQ(t["shape"], nlohmann::json::array({600, 500}));
  std::ifstream raw(dst + "/" + t["file"].get<std::string>(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(raw)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), weights_[0].size() * 4);
  EXPECT_EQ(0, std::memcmp(bytes.data(), weights_[0].data(), bytes.size()));
  char crc[16];
  snprintf(crc, sizeof(crc), "%08x", Crc32c(bytes.data(), bytes.size()));
  EXPECT_EQ(t["crc32c"], crc);
}

TEST_F(CkptCliTest, MissingStoreAndBadUsageFailClearly) {
  std::string out;
  EXPECT_EQ(RunEdl("ls --checkpoint_dir " + dir_.Join("nothing-here"), &out), 1);
  EXPECT_EQ(RunEdl("frobnicate --checkpoint_dir x", &out), 2);
  EXPECT_EQ(RunEdl("ls", &out), 2);  // --checkpoint_dir is required
}

}  // namespace
}  // namespace edl::ckpt
