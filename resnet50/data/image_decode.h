// Image decoding for the ImageFolder dataset: JPEG through libjpeg-turbo (its libjpeg API), PNG
// (some ImageNet "JPEG"s are PNGs under a .JPEG name) through libpng's simplified API. Grayscale
// and CMYK/YCCK JPEGs come out as RGB. A JPEG is decoded
//   - at 1/2, 1/4 or 1/8 scale in the DCT domain when asked (the caller picks the scale that still
//     covers its crop: JpegScaleDenominator), and
//   - only over the region the caller needs: rows above it are skipped without the inverse DCT
//     (jpeg_skip_scanlines), columns outside it are not converted (jpeg_crop_scanline, widened to
//     whole iMCUs), and decoding stops after its last row.
// Input bytes are untrusted: sizes are bounded before any allocation, and progressive scans are
// capped (a JPEG with thousands of tiny scans costs quadratic time).
//
// Thread-safety: an ImageDecoder holds no state; any number may run at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::resnet50 {

// An 8-bit RGB image, rows top to bottom: the region [x0, x0 + width) x [y0, y0 + height) of an
// image whose decoded size is full_width x full_height (the whole image when x0 = y0 = 0 and
// width, height = full_width, full_height).
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // [height, width, 3]
  int x0 = 0, y0 = 0;
  int full_width = 0, full_height = 0;
};

// Bounds on what a decoder accepts (an ImageNet image is ~110 KB and ~400x350 px).
namespace image_limits {
constexpr size_t kMaxFileBytes = 64u << 20;  // larger files are refused unread
constexpr int64_t kMaxPixels = 1ll << 26;    // width x height of the encoded image (64 Mpx)
constexpr int kMaxScans = 100;               // progressive JPEG scans (libjpeg-turbo writes ~10)
}  // namespace image_limits

enum class ImageFormat { kJpeg, kPng };

// A region of the source image in full-size pixel units: [x0, x1) x [y0, y1), possibly
// fractional.
struct SourceRegion {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

class ImageDecoder {
 public:
  // Reads the format and full-size dimensions from the header. Corruption (naming `what`, e.g.
  // the file) when the bytes are neither a JPEG nor a PNG, or the size is out of bounds.
  Status ReadHeader(const uint8_t* data, size_t size, const std::string& what, ImageFormat* format,
                    int* width, int* height);

  // Decodes to RGB. A JPEG is decoded at 1/scale_denom of its size (1, 2, 4 or 8; each side
  // becomes ceil(side / scale_denom)) and, when `region` is given, only over the part covering it
  // plus `margin` decoded pixels on every side (clipped to the image; possibly wider, to whole
  // iMCUs). A PNG is always decoded whole at full size. Damaged JPEG data that libjpeg-turbo can
  // still decode (a truncated file: the missing part comes out grey) is a success with *damaged
  // set. Corruption naming `what` when nothing could be decoded.
  Status Decode(const uint8_t* data, size_t size, const std::string& what, int scale_denom,
                RgbImage* out, bool* damaged, const SourceRegion* region = nullptr, int margin = 0);
};

// The largest scale denominator (8, 4, 2, else 1) at which a crop of crop_width x crop_height
// source pixels still spans at least `need` x `need` decoded pixels: decoding at 1/d then loses
// nothing a resample to `need` px would keep.
int JpegScaleDenominator(double crop_width, double crop_height, int need);

}  // namespace edl::resnet50
