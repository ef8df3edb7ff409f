// Image files (resnet50/data/image_decode.h): the bytes of a training set are not ours. ReadHeader
// and Decode return a Status whatever the bytes. As ImageFolder does, an accepted image is decoded
// whole and over a random crop (cropped and skipped scanlines, 1/1 and 1/8 scale), and resampled:
// the sizes agree with the header and every output value is finite and in the normalised range.
#include <algorithm>
#include <cmath>
#include <vector>

#include "resnet50/data/image_decode.h"
#include "resnet50/data/image_transform.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edl::resnet50;
  ImageDecoder dec;
  ImageFormat format;
  int w = 0, h = 0;
  if (!dec.ReadHeader(data, size, "fuzz input", &format, &w, &h).ok()) return 0;
  FUZZ_CHECK(w > 0 && h > 0 && int64_t{w} * h <= image_limits::kMaxPixels);
  if (int64_t{w} * h > (1 << 20)) return 0;  // valid but slow to decode: not what we fuzz
  SampleRng rng(size);
  const CropBox box = RandomResizedCropBox(w, h, RandomCropParams{}, &rng);
  FUZZ_CHECK(box.x0 >= 0 && box.y0 >= 0 && box.x1 <= w && box.y1 <= h && box.width() > 0);
  const SourceRegion region{box.x0, box.y0, box.x1, box.y1};
  for (int denom : {1, 8}) {
    for (const SourceRegion* r : {static_cast<const SourceRegion*>(nullptr), &region}) {
      RgbImage img;
      bool damaged = false;
      if (!dec.Decode(data, size, "fuzz input", denom, &img, &damaged, r, 2).ok()) continue;
      const int d = format == ImageFormat::kJpeg ? denom : 1;
      FUZZ_CHECK(img.full_width == (w + d - 1) / d && img.full_height == (h + d - 1) / d);
      FUZZ_CHECK(img.x0 >= 0 && img.y0 >= 0 && img.width > 0 && img.height > 0);
      FUZZ_CHECK(img.x0 + img.width <= img.full_width && img.y0 + img.height <= img.full_height);
      FUZZ_CHECK(img.pixels.size() == size_t{3} * img.width * img.height);
      const double sx = double(img.full_width) / w, sy = double(img.full_height) / h;
      CropBox in{box.x0 * sx - img.x0, box.y0 * sy - img.y0, box.x1 * sx - img.x0,
                 box.y1 * sy - img.y0};
      std::vector<float> out(3 * 8 * 8);
      ResampleNormalize(img, in, 8, true, out.data());
      for (float v : out) FUZZ_CHECK(std::isfinite(v) && std::abs(v) < 3.f);
    }
  }
  return 0;
}
