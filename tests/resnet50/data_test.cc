// IDX reader on the real Fashion-MNIST files and on corrupted copies; dataset normalisation,
// padding and augmentation; synthetic determinism; the prefetching BatchLoader; the DecodePool.
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "resnet50/data/batch_loader.h"
#include "resnet50/data/dataset.h"
#include "resnet50/data/decode_pool.h"
#include "tests/testutil.h"

namespace edl::resnet50 {
namespace {

const char kDir[] = "/usr/share/datasets/fashion-mnist";

bool HaveFashionMnist() {
  return std::filesystem::exists(std::string(kDir) + "/train-images-idx3-ubyte.gz");
}

#define REQUIRE_FASHION_MNIST()                             \
  if (!HaveFashionMnist())                                  \
  GTEST_SKIP() << "Fashion-MNIST not installed at " << kDir \
               << " (Debian package dataset-fashion-mnist)"

std::vector<uint8_t> Gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::vector<uint8_t> out, buf(1 << 16);
  int n;
  while ((n = gzread(f, buf.data(), buf.size())) > 0)
    out.insert(out.end(), buf.begin(), buf.begin() + n);
  gzclose(f);
  return out;
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, size_t len) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), len);
}

TEST(IdxTest, RealFashionMnistFiles) {
  REQUIRE_FASHION_MNIST();
  IdxImages train, test;
  std::vector<uint8_t> train_labels, test_labels;
  ASSERT_OK(ReadIdxImages(std::string(kDir) + "/train-images-idx3-ubyte.gz", &train));
  ASSERT_OK(ReadIdxImages(std::string(kDir) + "/t10k-images-idx3-ubyte.gz", &test));
  ASSERT_OK(ReadIdxLabels(std::string(kDir) + "/train-labels-idx1-ubyte.gz", &train_labels));
  ASSERT_OK(ReadIdxLabels(std::string(kDir) + "/t10k-labels-idx1-ubyte.gz", &test_labels));
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(train.rows, 28);
  EXPECT_EQ(train.cols, 28);
  EXPECT_EQ(train_labels.size(), 60000u);
  EXPECT_EQ(test_labels.size(), 10000u);
  EXPECT_EQ(train_labels[0], 9);  // ankle boot
  EXPECT_EQ(*std::min_element(train.pixels.begin(), train.pixels.end()), 0);
  EXPECT_EQ(*std::max_element(train.pixels.begin(), train.pixels.end()), 255);
  EXPECT_EQ(*std::max_element(train_labels.begin(), train_labels.end()), 9);
}

TEST(IdxTest, CorruptedCopiesAreClearErrors) {
  REQUIRE_FASHION_MNIST();
  test::ScratchDir dir("idx");
  std::vector<uint8_t> labels = Gunzip(std::string(kDir) + "/t10k-labels-idx1-ubyte.gz");
  std::vector<uint8_t> images = Gunzip(std::string(kDir) + "/t10k-images-idx3-ubyte.gz");
  ASSERT_EQ(labels.size(), 10008u);

  // Plain (uncompressed) copy reads fine.
  WriteFile(dir.Join("plain-labels"), labels, labels.size());
  std::vector<uint8_t> out;
  ASSERT_OK(ReadIdxLabels(dir.Join("plain-labels"), &out));
  EXPECT_EQ(out.size(), 10000u);

  // Truncated payload.
  WriteFile(dir.Join("short-images"), images, images.size() - 100);
  IdxImages im;
  Status s = ReadIdxImages(dir.Join("short-images"), &im);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("short-images"), std::string::npos) << s.ToString();
  // Truncated header.
  WriteFile(dir.Join("tiny"), images, 10);
  EXPECT_TRUE(ReadIdxImages(dir.Join("tiny"), &im).IsCorruption());
  // Wrong magic: a label file read as images, and a flipped byte.
  s = ReadIdxImages(dir.Join("plain-labels"), &im);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s.ToString();
  std::vector<uint8_t> bad = labels;
  bad[2] = 0x55;
  WriteFile(dir.Join("bad-magic"), bad, bad.size());
  EXPECT_TRUE(ReadIdxLabels(dir.Join("bad-magic"), &out).IsCorruption());
  // Truncated gzip stream.
  const std::string gz = std::string(kDir) + "/t10k-labels-idx1-ubyte.gz";
  std::ifstream in(gz, std::ios::binary);
  std::vector<uint8_t> gzbytes((std::istreambuf_iterator<char>(in)), {});
  WriteFile(dir.Join("cut.gz"), gzbytes, gzbytes.size() / 2);
  s = ReadIdxLabels(dir.Join("cut.gz"), &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cut.gz"), std::string::npos) << s.ToString();
  // Missing file.
  EXPECT_TRUE(ReadIdxLabels(dir.Join("absent"), &out).IsNotFound());
  auto ds = LoadFashionMnist(dir.path(), true);
  EXPECT_TRUE(ds.status().IsNotFound()) << ds.status().ToString();
}

TEST(DatasetTest, FashionMnistNormalisationAndPadding) {
  REQUIRE_FASHION_MNIST();
  auto ds28 = LoadFashionMnist(kDir, true, 28);
  auto ds32 = LoadFashionMnist(kDir, false, 32);
  ASSERT_OK(ds28.status());
  ASSERT_OK(ds32.status());
  EXPECT_EQ(ds28.value()->size(), 60000);
  EXPECT_EQ(ds32.value()->size(), 10000);
  EXPECT_EQ(ds32.value()->image_size(), 32);
  std::vector<float> img(2 * 28 * 28);
  std::vector<int32_t> lab(2);
  ASSERT_OK(ds28.value()->FillBatch({0, 1}, Augment{}, 0, img.data(), lab.data()));
  EXPECT_EQ(lab[0], 9);
  const float lo = (0.f - 0.2860f) / 0.3530f, hi = (1.f - 0.2860f) / 0.3530f;
  for (float v : img) {
    ASSERT_GE(v, lo - 1e-5f);
    ASSERT_LE(v, hi + 1e-5f);
  }
  std::vector<float> img32(32 * 32);
  ASSERT_OK(ds32.value()->FillBatch({0}, Augment{}, 0, img32.data(), lab.data()));
  EXPECT_NEAR(img32[0], lo, 1e-6);  // the border is padding
  // Augmentation changes the image but keeps the label; out-of-range index is an error.
  Augment aug{true, 4, true};
  std::vector<float> a(28 * 28), b(28 * 28);
  ASSERT_OK(ds28.value()->FillBatch({5}, Augment{}, 0, a.data(), lab.data()));
  ASSERT_OK(ds28.value()->FillBatch({5}, aug, 12345, b.data(), lab.data() + 1));
  EXPECT_EQ(lab[0], lab[1]);
  EXPECT_FALSE(ds28.value()->FillBatch({60000}, Augment{}, 0, a.data(), lab.data()).ok());
}

TEST(DatasetTest, SyntheticIsDeterministic) {
  auto a = MakeSyntheticDataset(100, 3, 8, 10, 7), b = MakeSyntheticDataset(100, 3, 8, 10, 7);
  std::vector<float> x(2 * 3 * 64), y(2 * 3 * 64);
  std::vector<int32_t> la(2), lb(2);
  ASSERT_OK(a->FillBatch({3, 99}, Augment{}, 0, x.data(), la.data()));
  ASSERT_OK(b->FillBatch({3, 99}, Augment{}, 0, y.data(), lb.data()));
  EXPECT_EQ(x, y);
  EXPECT_EQ(la, lb);
  EXPECT_NE(std::vector<float>(x.begin(), x.begin() + 192),
            std::vector<float>(x.begin() + 192, x.end()));
  double mean = 0, sq = 0;
  for (float v : x) mean += v, sq += v * v;
  EXPECT_NEAR(mean / x.size(), 0, 0.2);
  EXPECT_NEAR(sq / x.size(), 1, 0.25);
  EXPECT_FALSE(a->FillBatch({100}, Augment{}, 0, x.data(), la.data()).ok());
}

TEST(BatchLoaderTest, PrefetchedBatchEqualsDirectFill) {
  auto ds = MakeSyntheticDataset(1000, 1, 8, 10, 3);
  BatchLoader loader(ds.get(), Augment{}, 1);
  HostBatch direct, prefetched;
  ASSERT_OK(loader.Get(0, {1, 2, 3}, &direct));
  EXPECT_EQ(loader.prefetch_hits(), 0);
  for (int round = 0; round < 20; ++round) {
    loader.Prefetch(0, {1, 2, 3});
    loader.Prefetch(0, {4, 5});  // queued behind the first; still there after it is taken
    ASSERT_OK(loader.Get(0, {1, 2, 3}, &prefetched));
    EXPECT_EQ(prefetched.images, direct.images);
    EXPECT_EQ(prefetched.labels, direct.labels);
    ASSERT_OK(loader.Get(0, {4, 5}, &prefetched));
    EXPECT_EQ(prefetched.labels.size(), 2u);
  }
  EXPECT_EQ(loader.prefetch_hits(), 40);
  // A bad index surfaces as an error from Get, prefetched or not.
  loader.Prefetch(0, {5000});
  EXPECT_FALSE(loader.Get(0, {5000}, &prefetched).ok());
}

TEST(BatchLoaderTest, AMissKeepsTheNextStepsPrefetch) {
  // The runtime queues step k+1 before it asks for step k; when k was not queued (the first step,
  // or the first after a re-form) k is filled on the spot and k+1 stays queued for the next Get.
  auto ds = MakeSyntheticDataset(100, 1, 4, 10, 3);
  BatchLoader loader(ds.get(), Augment{}, 1);
  HostBatch b;
  loader.Prefetch(0, {7, 8});
  ASSERT_OK(loader.Get(0, {5, 6}, &b));
  EXPECT_EQ(loader.prefetch_hits(), 0);
  ASSERT_OK(loader.Get(0, {7, 8}, &b));
  EXPECT_EQ(loader.prefetch_hits(), 1);
  EXPECT_EQ(b.indices, (std::vector<int64_t>{7, 8}));
  // The same indices in another epoch are another batch.
  loader.Prefetch(1, {1});
  ASSERT_OK(loader.Get(2, {1}, &b));
  EXPECT_EQ(loader.prefetch_hits(), 1);
  EXPECT_EQ(b.epoch, 2);
}

TEST(DatasetTest, FashionAugmentationDependsOnTheSampleNotTheBatch) {
  REQUIRE_FASHION_MNIST();
  auto ds = LoadFashionMnist(kDir, false, 28);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  const Augment aug{true, 4, true};
  std::vector<float> pair(2 * 28 * 28), single(28 * 28), other(28 * 28);
  std::vector<int32_t> lab(2);
  ASSERT_OK(ds.value()->FillBatch({5, 6}, aug, 77, pair.data(), lab.data()));
  ASSERT_OK(ds.value()->FillBatch({6}, aug, 77, single.data(), lab.data()));
  EXPECT_EQ(std::vector<float>(pair.begin() + 28 * 28, pair.end()), single);
  // Another seed (another epoch) draws again: some of 8 seeds must differ from seed 77.
  int differ = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    ASSERT_OK(ds.value()->FillBatch({6}, aug, seed, other.data(), lab.data()));
    differ += other != single;
  }
  EXPECT_GT(differ, 0);
}

TEST(DecodePoolTest, EveryIndexOnceFromEveryThreadAndConcurrentCallers) {
  DecodePool pool(4);
  EXPECT_EQ(pool.threads(), 4);
  // Two callers (a prefetch thread and the training thread) at once: their rounds queue up.
  auto caller = [&](int rounds, int n, bool* ok) {
    for (int r = 0; r < rounds; ++r) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> bad_worker{0};
      pool.ParallelFor(n, [&](int64_t i, int worker) {
        hits[i].fetch_add(1);
        if (worker < 0 || worker >= 4) bad_worker.fetch_add(1);
      });
      for (auto& h : hits) *ok = *ok && h.load() == 1;
      *ok = *ok && bad_worker.load() == 0;
    }
  };
  bool ok1 = true, ok2 = true;
  std::thread other(caller, 50, 97, &ok2);
  caller(50, 300, &ok1);
  other.join();
  EXPECT_TRUE(ok1);
  EXPECT_TRUE(ok2);
  DecodePool single(1);  // no helper thread: the caller does everything
  int64_t sum = 0;
  single.ParallelFor(10, [&](int64_t i, int worker) { sum += i + worker; });
  EXPECT_EQ(sum, 45);
}

}  // namespace
}  // namespace edl::resnet50
