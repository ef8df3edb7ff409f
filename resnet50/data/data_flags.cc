#include "resnet50/data/data_flags.h"

#include "resnet50/data/image_folder.h"

#include <utility>
#include <vector>

namespace edl::resnet50 {

void AddDataFlags(po::options_description* desc, DataFlags* d) {
  desc->add_options()("data", po::value(&d->data)->default_value("fashion-mnist"),
                      "fashion-mnist|synthetic|imagefolder")(
      "data_dir", po::value(&d->data_dir)->default_value("/usr/share/datasets/fashion-mnist"),
      "directory with the Fashion-MNIST IDX files (.gz or plain); imagefolder: the directory "
      "holding train/<class>/*.jpg and val/<class>/*.jpg")(
      "data_threads", po::value(&d->data_threads)->default_value(1),
      "imagefolder: JPEG decode + augmentation threads per split, preparing the next batch while "
      "the step runs")(
      "image_size", po::value(&d->image_size)->default_value(0),
      "image side in px; 0 = 28 for fashion-mnist, 32 (resnet20/56) or 224 for synthetic and "
      "imagefolder; fashion-mnist images are zero-padded to it; imagefolder crops to it "
      "(evaluation resizes to image_size*256/224 first)")(
      "channels", po::value(&d->channels)->default_value(3, "3"), "synthetic image channels")(
      "synthetic_train", po::value(&d->synthetic_train)->default_value(0),
      "synthetic training samples; 0 = 100 batches")(
      "synthetic_test", po::value(&d->synthetic_test)->default_value(0),
      "synthetic test samples; 0 = 4 batches")(
      "train_samples", po::value(&d->train_samples)->default_value(0),
      "use only the first N training samples (fast tests and demos); 0 = all");
}

Status ValidateDataFlags(const DataFlags& d) {
  if (d.image_size < 0) return Status::InvalidArgument("--image_size must be >= 0");
  if (d.train_samples < 0) return Status::InvalidArgument("--train_samples must be >= 0");
  if (d.data_threads < 1 || d.data_threads > 256) {
    return Status::InvalidArgument("--data_threads must be in 1..256");
  }
  return Status::OK();
}

bool IsCifarModel(const std::string& m) { return m == "resnet20" || m == "resnet56"; }

namespace {

// The first `n` samples of another dataset (--train_samples).
class PrefixDataset : public Dataset {
 public:
  PrefixDataset(std::unique_ptr<Dataset> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_; }
  int channels() const override { return base_->channels(); }
  int image_size() const override { return base_->image_size(); }
  int num_classes() const override { return base_->num_classes(); }
  std::string name() const override {
    return base_->name() + " (first " + std::to_string(n_) + ")";
  }
  Status FillBatch(const std::vector<int64_t>& indices, const Augment& aug, uint64_t aug_seed,
                   float* images, int32_t* labels) const override {
    for (int64_t i : indices) {
      if (i < 0 || i >= n_) {
        return Status::InvalidArgument("sample " + std::to_string(i) + " outside the first " +
                                       std::to_string(n_));
      }
    }
    return base_->FillBatch(indices, aug, aug_seed, images, labels);
  }

 private:
  const std::unique_ptr<Dataset> base_;
  const int64_t n_;
};

Status LoadFullData(const DataFlags& d, const std::string& model, int64_t batch, uint64_t seed,
                    bool load_test, std::unique_ptr<Dataset>* train,
                    std::unique_ptr<Dataset>* test) {
  if (d.data == "fashion-mnist") {
    const int size = d.image_size == 0 ? 28 : d.image_size;
    auto tr = LoadFashionMnist(d.data_dir, true, size);
    if (!tr.ok()) return tr.status();
    *train = std::move(tr.value());
    if (load_test) {
      auto te = LoadFashionMnist(d.data_dir, false, size);
      if (!te.ok()) return te.status();
      *test = std::move(te.value());
    }
    return Status::OK();
  }
  if (d.data == "synthetic") {
    const int size = d.image_size != 0 ? d.image_size : (IsCifarModel(model) ? 32 : 224);
    if (d.channels != 1 && d.channels != 3) {
      return Status::InvalidArgument("--channels must be 1 or 3");
    }
    const int64_t ntrain = d.synthetic_train > 0 ? d.synthetic_train : 100 * batch;
    const int64_t ntest = d.synthetic_test > 0 ? d.synthetic_test : 4 * batch;
    *train = MakeSyntheticDataset(ntrain, d.channels, size, 10, seed);
    if (load_test) *test = MakeSyntheticDataset(ntest, d.channels, size, 10, seed + 1);
    return Status::OK();
  }
  if (d.data == "imagefolder") {
    ImageFolderOptions o;
    o.image_size = d.image_size != 0 ? d.image_size : (IsCifarModel(model) ? 32 : 224);
    o.threads = d.data_threads;
    return LoadImageFolder(d.data_dir, o, load_test, train, test);
  }
  return Status::InvalidArgument("--data '" + d.data +
                                 "' is unknown; use fashion-mnist, synthetic or imagefolder");
}

}  // namespace

Status LoadData(const DataFlags& d, const std::string& model, int64_t batch, uint64_t seed,
                bool load_test, std::unique_ptr<Dataset>* train, std::unique_ptr<Dataset>* test) {
  EDL_RETURN_IF_ERROR(LoadFullData(d, model, batch, seed, load_test, train, test));
  if (d.train_samples > 0 && d.train_samples < (*train)->size()) {
    *train = std::make_unique<PrefixDataset>(std::move(*train), d.train_samples);
  }
  return Status::OK();
}

}  // namespace edl::resnet50
