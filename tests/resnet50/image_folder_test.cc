// ImageFolder on a set built by scripts/make_imagefolder.sh (Fashion-MNIST upscaled, colourised,
// varied sizes and JPEG qualities, plus awkward and broken files): decoding against PIL, the
// evaluation transform against torchvision's (both through Debian's python3), DCT-scaled decoding
// against full-size decoding, per-sample determinism across thread counts and batchings, broken
// files skipped and counted (in the dataset and in a real `edl train` run), and the start-up
// errors. Skipped when Fashion-MNIST or python3 with numpy and PIL is missing.
#include "resnet50/data/image_folder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "resnet50/data/batch_loader.h"
#include "resnet50/data/image_decode.h"
#include "resnet50/data/image_transform.h"
#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl::resnet50 {
namespace {

using std::chrono::milliseconds;

constexpr const char* kPython = "/usr/bin/python3";
constexpr const char* kFashion = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

// The reference side: PIL decoding ("decode OUT files": int32 width, height, then RGB bytes per
// file) and torchvision's evaluation transform ("eval OUT SIZE RESIZE files": float32 [3,S,S]).
constexpr const char* kReference = R"(import struct, sys
from PIL import Image
mode, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as f:
    if mode == "decode":
        for p in sys.argv[3:]:
            im = Image.open(p).convert("RGB")
            f.write(struct.pack("<ii", im.width, im.height))
            f.write(im.tobytes())
    else:
        from torchvision import transforms as T
        size, resize = int(sys.argv[3]), int(sys.argv[4])
        t = T.Compose([T.Resize(resize), T.CenterCrop(size), T.ToTensor(),
                       T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        for p in sys.argv[5:]:
            f.write(t(Image.open(p).convert("RGB")).numpy().astype("float32").tobytes())
)";

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

class ImageFolderTest : public ::testing::Test {
 protected:
  // The set is the ctest fixture's (resnet50_image_folder_test.fixture: scripts/make_imagefolder.sh
  // --classes 4 --train_per_class 6 --val_per_class 3, once per tree), made where the inputs are.
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kFashion) || !std::filesystem::exists(kPython)) return;
    dir_ = new test::ScratchDir("imagefolder");
    if (itest::RunCommand({kPython, "-c", "import numpy, PIL"}, dir_->Join("probe.log")) != 0)
      return;
    made_ = std::filesystem::exists(Set() + "/manifest.txt");
    std::ofstream(dir_->Join("reference.py")) << kReference;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (dir_ == nullptr || !std::filesystem::exists(dir_->Join("reference.py"))) {
      GTEST_SKIP() << "needs " << kFashion << " and " << kPython
                   << " with numpy and PIL (dataset-fashion-mnist, python3-numpy, python3-pil)";
    }
    ASSERT_TRUE(made_) << "no image set at " << Set() << ": run the test through ctest (ctest -R "
                       << "'^resnet50_image_folder_test\\.' runs the fixture that makes it first)";
    std::ifstream in(Set() + "/manifest.txt");
    std::string rel, kind;
    while (in >> rel >> kind) kind_[Set() + "/" + rel] = kind;
    ASSERT_GT(kind_.size(), 40u);
  }

  static std::string Set() { return EDL_IMAGEFOLDER_SET; }
  static bool Undecodable(const std::string& kind) {
    return kind == "empty" || kind == "garbage" || kind == "text";
  }
  // Runs the reference script; its output file's bytes.
  std::vector<uint8_t> Reference(std::vector<std::string> args) {
    const std::string out = dir_->Join("reference.out");
    std::vector<std::string> argv = {kPython, dir_->Join("reference.py"), args[0], out};
    argv.insert(argv.end(), args.begin() + 1, args.end());
    const int rc = itest::RunCommand(argv, dir_->Join("reference.log"), milliseconds(120000));
    EXPECT_EQ(rc, 0) << itest::Slurp(dir_->Join("reference.log"));
    return ReadBytes(out);
  }

  static test::ScratchDir* dir_;
  static bool made_;
  std::map<std::string, std::string> kind_;  // path -> kind, from manifest.txt
};

test::ScratchDir* ImageFolderTest::dir_ = nullptr;
bool ImageFolderTest::made_ = false;

TEST_F(ImageFolderTest, FullSizeDecodeMatchesPil) {
  std::vector<std::string> files;
  for (const auto& [path, kind] : kind_) {
    if (kind == "jpeg" && files.size() < 24) files.push_back(path);
    if (kind == "gray" || kind == "cmyk" || kind == "progressive" || kind == "png" ||
        kind == "tiny") {
      files.push_back(path);
    }
  }
  const std::vector<uint8_t> ref = Reference([&] {
    std::vector<std::string> a = {"decode"};
    a.insert(a.end(), files.begin(), files.end());
    return a;
  }());
  ImageDecoder dec;
  size_t off = 0;
  for (const std::string& path : files) {
    ASSERT_LE(off + 8, ref.size());
    int32_t w = 0, h = 0;
    std::memcpy(&w, &ref[off], 4);
    std::memcpy(&h, &ref[off + 4], 4);
    off += 8;
    const std::vector<uint8_t> bytes = ReadBytes(path);
    RgbImage img;
    bool damaged = true;
    ASSERT_OK(dec.Decode(bytes.data(), bytes.size(), path, 1, &img, &damaged));
    EXPECT_FALSE(damaged) << path;
    ASSERT_EQ(img.width, w) << path;
    ASSERT_EQ(img.height, h) << path;
    int max_diff = 0;
    double sum = 0;
    for (size_t i = 0; i < img.pixels.size(); ++i) {
      const int d = std::abs(int{img.pixels[i]} - int{ref[off + i]});
      max_diff = std::max(max_diff, d);
      sum += d;
    }
    off += img.pixels.size();
    std::cout << kind_[path] << " " << w << "x" << h << " max diff " << max_diff << " mean "
              << sum / img.pixels.size() << "\n";
    // PIL decodes with the same libjpeg-turbo; CMYK -> RGB rounds differently by at most 1.
    EXPECT_LE(max_diff, kind_[path] == "cmyk" ? 1 : 0) << path;
  }
  EXPECT_EQ(off, ref.size());
}

TEST_F(ImageFolderTest, EvaluationTransformMatchesTorchvision) {
  std::vector<std::string> classes, files;
  ImageFolderOptions o;
  o.image_size = 224;
  o.threads = 2;
  auto val = OpenImageFolderSplit(Set() + "/val", o, &classes, &files);
  ASSERT_TRUE(val.ok()) << val.status().ToString();
  ASSERT_EQ(classes.size(), 4u);
  ASSERT_EQ(files.size(), 12u);
  const int64_t n = val.value()->size();
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = i;
  const size_t per = 3 * 224 * 224;
  std::vector<float> ours(n * per);
  std::vector<int32_t> labels(n);
  ASSERT_OK(val.value()->FillBatch(idx, Augment{}, 0, ours.data(), labels.data()));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(labels[i], i / 3) << files[i];  // sorted classes

  std::vector<std::string> args = {"eval", "224", "256"};
  args.insert(args.end(), files.begin(), files.end());
  const std::vector<uint8_t> ref_bytes = Reference(args);
  ASSERT_EQ(ref_bytes.size(), ours.size() * sizeof(float));
  std::vector<float> ref(ours.size());
  std::memcpy(ref.data(), ref_bytes.data(), ref_bytes.size());
  for (int64_t i = 0; i < n; ++i) {
    double max_diff = 0, sum = 0;
    for (size_t j = i * per; j < (i + 1) * per; ++j) {
      const double d = std::abs(ours[j] - ref[j]);
      max_diff = std::max(max_diff, d);
      sum += d;
    }
    // Was it decoded at a reduced scale (the crop box spans >= 2 x 224 px)?
    const std::vector<uint8_t> bytes = ReadBytes(files[i]);
    ImageDecoder dec;
    ImageFormat f;
    int w = 0, h = 0;
    ASSERT_OK(dec.ReadHeader(bytes.data(), bytes.size(), files[i], &f, &w, &h));
    const CropBox box = CenterCropBox(w, h, 256, 224);
    const int denom = JpegScaleDenominator(box.width(), box.height(), 224);
    std::cout << files[i] << " " << w << "x" << h << " at 1/" << denom << ": max diff " << max_diff
              << " mean " << sum / per << "\n";
    // PIL rounds to 8 bits between its two resampling passes; we do not: about one grey level
    // (1 / 255 / 0.225 = 0.017 after normalisation), a few at sharp edges. Decoding at 1/2 in the
    // DCT domain (then resampling less) instead of resampling the full image adds about as much.
    EXPECT_LT(max_diff, denom == 1 ? 0.05 : 0.15) << files[i];
    EXPECT_LT(sum / per, denom == 1 ? 0.008 : 0.02) << files[i];
  }
}

TEST_F(ImageFolderTest, ScaledDecodeIsCloseToFullSizeDecode) {
  // The largest training JPEG, resampled to 64 px from a 1/d-scale decode and from full size.
  ImageDecoder dec;
  std::string big;
  int big_w = 0, big_h = 0;
  for (const auto& [path, kind] : kind_) {
    if (kind != "jpeg") continue;
    const std::vector<uint8_t> b = ReadBytes(path);
    ImageFormat f;
    int w = 0, h = 0;
    ASSERT_OK(dec.ReadHeader(b.data(), b.size(), path, &f, &w, &h));
    if (std::min(w, h) > std::min(big_w, big_h)) big = path, big_w = w, big_h = h;
  }
  ASSERT_GE(std::min(big_w, big_h), 256) << "the generated set has no large image";
  const int d = JpegScaleDenominator(big_w, big_h, 64);
  EXPECT_GE(d, 4) << big_w << "x" << big_h;
  EXPECT_EQ(JpegScaleDenominator(big_w, big_h, std::min(big_w, big_h)), 1);
  const std::vector<uint8_t> bytes = ReadBytes(big);
  RgbImage full, scaled;
  bool damaged = false;
  ASSERT_OK(dec.Decode(bytes.data(), bytes.size(), big, 1, &full, &damaged));
  ASSERT_OK(dec.Decode(bytes.data(), bytes.size(), big, d, &scaled, &damaged));
  EXPECT_EQ(scaled.width, (big_w + d - 1) / d);
  EXPECT_EQ(scaled.height, (big_h + d - 1) / d);
  EXPECT_EQ(scaled.full_width, scaled.width);
  std::vector<float> a(3 * 64 * 64), b(3 * 64 * 64);
  ResampleNormalize(full, {0, 0, double(big_w), double(big_h)}, 64, false, a.data());
  const double sx = double(scaled.width) / big_w, sy = double(scaled.height) / big_h;
  ResampleNormalize(scaled, {0, 0, big_w * sx, big_h * sy}, 64, false, b.data());
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(a[i] - b[i]);
  std::cout << big << " " << big_w << "x" << big_h << " at 1/" << d << ": mean diff "
            << sum / a.size() << "\n";
  EXPECT_LT(sum / a.size(), 0.05);  // ~3 grey levels
}

TEST_F(ImageFolderTest, RegionDecodeEqualsTheWindowOfAWholeDecode) {
  // Cropped and skipped scanlines give the same pixels as decoding everything, at every scale,
  // for every generated JPEG kind (4:2:0 colour, grey, CMYK, progressive, truncated).
  ImageDecoder dec;
  int checked = 0;
  for (const auto& [path, kind] : kind_) {
    if (kind == "png" || Undecodable(kind) || (kind == "jpeg" && ++checked > 12)) continue;
    const std::vector<uint8_t> bytes = ReadBytes(path);
    ImageFormat f;
    int w = 0, h = 0;
    ASSERT_OK(dec.ReadHeader(bytes.data(), bytes.size(), path, &f, &w, &h));
    const SourceRegion region{w * 0.3, h * 0.55, w * 0.7, h * 0.8};
    for (int d : {1, 2, 8}) {
      RgbImage whole, part;
      bool damaged = false;
      ASSERT_OK(dec.Decode(bytes.data(), bytes.size(), path, d, &whole, &damaged));
      ASSERT_OK(dec.Decode(bytes.data(), bytes.size(), path, d, &part, &damaged, &region, 2));
      EXPECT_EQ(part.full_width, whole.width);
      EXPECT_EQ(part.full_height, whole.height);
      // The part covers the region plus the margin (clipped to the image).
      const double sx = double(whole.width) / w, sy = double(whole.height) / h;
      EXPECT_LE(part.x0, std::max(0, int(std::floor(region.x0 * sx)) - 2)) << path;
      EXPECT_LE(part.y0, std::max(0, int(std::floor(region.y0 * sy)) - 2)) << path;
      EXPECT_GE(part.x0 + part.width, std::min(whole.width, int(std::ceil(region.x1 * sx)) + 2))
          << path;
      EXPECT_GE(part.y0 + part.height, std::min(whole.height, int(std::ceil(region.y1 * sy)) + 2))
          << path;
      ASSERT_LE(part.x0 + part.width, whole.width);
      ASSERT_LE(part.y0 + part.height, whole.height);
      int64_t differ = 0;
      for (int y = 0; y < part.height; ++y) {
        const uint8_t* a = &part.pixels[size_t(y) * part.width * 3];
        const uint8_t* b = &whole.pixels[(size_t(part.y0 + y) * whole.width + part.x0) * 3];
        differ += !std::equal(a, a + part.width * 3, b);
      }
      EXPECT_EQ(differ, 0) << path << " (" << kind << ") at 1/" << d;
    }
  }
}

TEST_F(ImageFolderTest, AugmentationDependsOnlyOnSeedEpochAndIndex) {
  ImageFolderOptions o;
  o.image_size = 48;
  std::vector<std::string> classes;
  o.threads = 1;
  auto one = OpenImageFolderSplit(Set() + "/train", o, &classes);
  o.threads = 3;
  auto three = OpenImageFolderSplit(Set() + "/train", o, &classes);
  ASSERT_TRUE(one.ok() && three.ok());
  const int64_t n = one.value()->size();
  const size_t per = 3 * 48 * 48;
  const Augment aug{true, 0, true};
  const uint64_t epoch0 = MixSeed(7, 0), epoch1 = MixSeed(7, 1);
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  std::vector<float> a(n * per), c(n * per);
  std::vector<int32_t> la(n), lc(n);
  ASSERT_OK(one.value()->FillBatch(all, aug, epoch0, a.data(), la.data()));
  // Three threads, batches of 5 in reverse order: every sample identical.
  for (int64_t hi = n; hi > 0; hi -= 5) {
    std::vector<int64_t> batch;
    for (int64_t i = hi - 1; i >= std::max<int64_t>(0, hi - 5); --i) batch.push_back(i);
    std::vector<float> x(batch.size() * per);
    std::vector<int32_t> lx(batch.size());
    ASSERT_OK(three.value()->FillBatch(batch, aug, epoch0, x.data(), lx.data()));
    for (size_t k = 0; k < batch.size(); ++k) {
      EXPECT_TRUE(
          std::equal(x.begin() + k * per, x.begin() + (k + 1) * per, a.begin() + batch[k] * per))
          << "sample " << batch[k];
      EXPECT_EQ(lx[k], la[batch[k]]);
    }
  }
  // Another epoch draws other crops: most decodable samples change.
  ASSERT_OK(three.value()->FillBatch(all, aug, epoch1, c.data(), lc.data()));
  EXPECT_EQ(la, lc);
  int64_t changed = 0, decoded = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (la[i] == kSkippedLabel) continue;
    ++decoded;
    changed += !std::equal(a.begin() + i * per, a.begin() + (i + 1) * per, c.begin() + i * per);
  }
  EXPECT_GT(changed, decoded * 3 / 4) << changed << " of " << decoded;
}

TEST_F(ImageFolderTest, BrokenFilesAreSkippedAndNamedOthersDecoded) {
  ImageFolderOptions o;
  o.image_size = 32;
  o.threads = 2;
  std::vector<std::string> classes, files;
  auto train = OpenImageFolderSplit(Set() + "/train", o, &classes, &files);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  const int64_t n = train.value()->size();
  ASSERT_EQ(static_cast<size_t>(n), files.size());
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  BatchLoader loader(train.value().get(), Augment{true, 0, true}, 3);
  HostBatch b;
  ASSERT_OK(loader.Get(0, all, &b));
  std::set<std::string> skipped, want;
  for (int64_t i = 0; i < n; ++i) {
    if (b.labels[i] == kSkippedLabel) skipped.insert(files[i]);
    if (Undecodable(kind_.at(files[i]))) want.insert(files[i]);
  }
  EXPECT_EQ(skipped, want);
  EXPECT_EQ(want.size(), 3u);
  EXPECT_EQ(b.skipped(), 3);
}

TEST_F(ImageFolderTest, TrainerSkipsBrokenFilesWithOneWarningEachAndCountsThem) {
  // A real `edl train` run on the set: 2 epochs, evaluation with top-5, the three undecodable
  // files (and the truncated one, decoded with damage) named once each however often they are
  // loaded, and the skipped ones counted in the summaries.
  const std::string log = dir_->Join("train.log");
  const int rc = itest::RunCommand(
      {test::EdlBinary(), "train", "--model",      "resnet20", "--data",         "imagefolder",
       "--data_dir",      Set(),   "--image_size", "32",       "--batch_size",   "8",
       "--epochs",        "2",     "--threads",    "1",        "--data_threads", "2",
       "--log_every",     "1",     "--lr",         "0.05"},
      log, milliseconds(240000));
  const std::string out = itest::Slurp(log);
  ASSERT_EQ(rc, 0) << out;
  for (const auto& [path, kind] : kind_) {
    size_t count = 0;
    for (size_t at = out.find(path); at != std::string::npos; at = out.find(path, at + 1)) ++count;
    EXPECT_EQ(count, Undecodable(kind) || kind == "truncated" ? 1u : 0u)
        << path << " (" << kind << ")\n"
        << out;
  }
  // Per trainer (epochs counted from 1, as in the progress and eval lines) and for the whole job.
  EXPECT_NE(out.find("epoch 1: 3 of 33 training samples this trainer loaded"), std::string::npos)
      << out;
  EXPECT_NE(out.find("6 training samples skipped as unreadable by this trainer"), std::string::npos)
      << out;
  EXPECT_NE(out.find("epoch 1: 3 of 33 training samples were skipped as unreadable, all ranks"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("epoch 2: 3 of 33 training samples were skipped as unreadable, all ranks"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("data: 6 training samples skipped as unreadable by all ranks"),
            std::string::npos)
      << out;
  EXPECT_TRUE(std::regex_search(
      out,
      std::regex(
          R"(eval epoch 2 step \d+: test loss [0-9.]+ acc [0-9.]+% top5 100.00% \(12 images)")))
      << out;  // 4 classes: the label is always among the top 5
}

TEST_F(ImageFolderTest, TwoRanksSumTheirSkippedSamplesForTheJob) {
  // Two trainers under `edl launch` share every step: each warns about the files it loaded, and
  // rank 0 prints the whole job's count per epoch (3 broken files of 33 per epoch), which neither
  // trainer's own count reaches alone unless one of them loaded all three.
  const std::string logs = dir_->Join("launch2");
  const int rc = itest::RunCommand({test::EdlBinary(),
                                    "launch",
                                    "--nproc_per_node",
                                    "2",
                                    "--log_dir",
                                    logs,
                                    "--",
                                    test::EdlBinary(),
                                    "train",
                                    "--model",
                                    "resnet20",
                                    "--data",
                                    "imagefolder",
                                    "--data_dir",
                                    Set(),
                                    "--image_size",
                                    "32",
                                    "--batch_size",
                                    "4",
                                    "--epochs",
                                    "2",
                                    "--threads",
                                    "1",
                                    "--data_threads",
                                    "1",
                                    "--log_every",
                                    "1",
                                    "--lr",
                                    "0.05"},
                                   dir_->Join("launch2.log"), milliseconds(240000));
  const std::string rank0 = itest::Slurp(logs + "/trainer-0.log");
  const std::string rank1 = itest::Slurp(logs + "/trainer-1.log");
  ASSERT_EQ(rc, 0) << itest::Slurp(dir_->Join("launch2.log")) << rank0 << rank1;
  EXPECT_NE(rank0.find("epoch 1: 3 of 33 training samples were skipped as unreadable, all ranks"),
            std::string::npos)
      << rank0;
  EXPECT_NE(rank0.find("epoch 2: 3 of 33 training samples were skipped as unreadable, all ranks"),
            std::string::npos)
      << rank0;
  EXPECT_EQ(rank1.find("were skipped as unreadable, all ranks"), std::string::npos)
      << "rank 0 only\n"
      << rank1;
  for (const std::string* log : {&rank0, &rank1}) {
    EXPECT_NE(log->find("data: 6 training samples skipped as unreadable by all ranks"),
              std::string::npos)
        << *log;
  }
  // Each trainer's own counts add up to the job's.
  std::smatch m0, m1;
  const std::regex own(R"(data: (\d+) training samples skipped as unreadable by this trainer)");
  const bool has0 = std::regex_search(rank0, m0, own), has1 = std::regex_search(rank1, m1, own);
  EXPECT_EQ((has0 ? std::stoi(m0[1]) : 0) + (has1 ? std::stoi(m1[1]) : 0), 6) << rank0 << rank1;
}

TEST_F(ImageFolderTest, EmptyClassAndMismatchedSplitsAreClearErrors) {
  const std::string root = dir_->Join("bad");
  std::filesystem::create_directories(root + "/train/cat");
  std::filesystem::create_directories(root + "/train/dog");
  std::filesystem::create_directories(root + "/val/cat");
  std::filesystem::create_directories(root + "/val/emu");
  std::string jpeg;
  for (const auto& [path, kind] : kind_) {
    if (kind == "jpeg") jpeg = path;
  }
  for (const char* f : {"/train/cat/a.jpg", "/val/cat/a.jpg", "/val/emu/a.jpg"}) {
    std::filesystem::copy_file(jpeg, root + f, std::filesystem::copy_options::overwrite_existing);
  }
  ImageFolderOptions o;
  std::unique_ptr<Dataset> train, val;
  Status s = LoadImageFolder(root, o, true, &train, &val);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(root + "/train/dog: class folder holds no"), std::string::npos)
      << s.ToString();

  std::filesystem::copy_file(jpeg, root + "/train/dog/a.jpg");
  s = LoadImageFolder(root, o, true, &train, &val);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("only in train: 'dog'; only in val: 'emu'"), std::string::npos)
      << s.ToString();
  EXPECT_OK(LoadImageFolder(root, o, false, &train, &val));  // no evaluation: val not read
  EXPECT_EQ(train->num_classes(), 2);

  s = LoadImageFolder(dir_->Join("nowhere"), o, false, &train, &val);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("nowhere/train: no such directory"), std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace edl::resnet50
