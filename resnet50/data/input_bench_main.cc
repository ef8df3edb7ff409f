// edl_input_bench: the ImageFolder input pipeline alone, as the trainer drives it (bench/
// input_pipeline.sh). Batches of the training split in DataPlan order go through a BatchLoader
// (RandomResizedCrop + flip, decode pool of --data_threads threads), the next batch prefetched
// while the current one is taken. Prints one line:
//   pipeline threads T batch B images N seconds S images/s X cpu_s C
// over the batches after --warmup (process CPU time over the same window in cpu_s).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "edl/base/flags.h"
#include "edl/runtime/data_plan.h"
#include "resnet50/data/batch_loader.h"
#include "resnet50/data/image_folder.h"

namespace {

double CpuSeconds() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace edl;
  std::string dir;
  int threads = 1, size = 224;
  int64_t batch = 32, batches = 20, warmup = 3;
  po::options_description d("edl_input_bench flags");
  d.add_options()("data_dir", po::value(&dir)->required(),
                  "ImageFolder root (DIR/train/<class>/*.jpg)")(
      "data_threads", po::value(&threads)->default_value(1), "decode threads")(
      "image_size", po::value(&size)->default_value(224), "crop size")(
      "batch_size", po::value(&batch)->default_value(32), "images per batch")(
      "batches", po::value(&batches)->default_value(20), "timed batches")(
      "warmup", po::value(&warmup)->default_value(3), "untimed batches first");
  ParsedFlags parsed;
  Status s = ParseFlags("input_bench", "usage: edl_input_bench --data_dir DIR [flags]", d, argc,
                        argv, &parsed);
  if (!s.ok()) {
    std::cerr << "edl_input_bench: " << s.ToString() << "\n";
    return 2;
  }
  if (parsed.help) return 0;
  resnet50::ImageFolderOptions o;
  o.image_size = size;
  o.threads = threads;
  std::unique_ptr<resnet50::Dataset> train, val;
  s = resnet50::LoadImageFolder(dir, o, false, &train, &val);
  if (!s.ok()) {
    std::cerr << "edl_input_bench: " << s.ToString() << "\n";
    return 2;
  }
  resnet50::BatchLoader loader(train.get(), resnet50::Augment{true, 0, true}, 1);
  runtime::DataPlan plan(train->size(), 1);
  const std::vector<int64_t> b = {batch};
  runtime::DataPosition pos;
  resnet50::HostBatch hb;
  auto t0 = std::chrono::steady_clock::now();
  double cpu0 = CpuSeconds();
  int64_t images = 0;
  for (int64_t i = 0; i < warmup + batches; ++i) {
    if (i == warmup) {
      t0 = std::chrono::steady_clock::now();
      cpu0 = CpuSeconds();
      images = 0;
    }
    const runtime::DataPosition next = plan.Advance(pos, b);
    loader.Prefetch(next.epoch, plan.Slice(next, b, 0));
    s = loader.Get(pos.epoch, plan.Slice(pos, b, 0), &hb);
    if (!s.ok()) {
      std::cerr << "edl_input_bench: " << s.ToString() << "\n";
      return 1;
    }
    images += static_cast<int64_t>(hb.labels.size());
    pos = next;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("pipeline threads %d batch %ld images %ld seconds %.3f images/s %.1f cpu_s %.3f\n",
              threads, static_cast<long>(batch), static_cast<long>(images), secs, images / secs,
              CpuSeconds() - cpu0);
  return 0;
}
