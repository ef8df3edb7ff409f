#include "resnet50/data/image_decode.h"

// jpeglib.h needs size_t and FILE declared first.
#include <csetjmp>
#include <cstdio>

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace edl::resnet50 {

namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

bool IsPng(const uint8_t* data, size_t size) {
  return size >= sizeof(kPngSignature) &&
         std::memcmp(data, kPngSignature, sizeof(kPngSignature)) == 0;
}

Status CheckSize(const std::string& what, int64_t w, int64_t h) {
  if (w <= 0 || h <= 0 || w * h > image_limits::kMaxPixels) {
    return Status::Corruption(what + ": image size " + std::to_string(w) + "x" + std::to_string(h) +
                              " is outside 1x1 .. " + std::to_string(image_limits::kMaxPixels) +
                              " pixels");
  }
  return Status::OK();
}

// ---- PNG (libpng's simplified API; it reports errors through its return values).

Status PngHeader(const uint8_t* data, size_t size, const std::string& what, png_image* img) {
  std::memset(img, 0, sizeof(*img));
  img->version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(img, data, size)) {
    return Status::Corruption(what + ": not a readable PNG (" + img->message + ")");
  }
  return CheckSize(what, img->width, img->height);
}

Status DecodePng(const uint8_t* data, size_t size, const std::string& what, RgbImage* out) {
  png_image img;
  Status s = PngHeader(data, size, what, &img);
  if (!s.ok()) {
    png_image_free(&img);
    return s;
  }
  img.format = PNG_FORMAT_RGB;  // grey, palette and alpha images converted (alpha over black)
  out->width = out->full_width = static_cast<int>(img.width);
  out->height = out->full_height = static_cast<int>(img.height);
  out->x0 = out->y0 = 0;
  out->pixels.resize(PNG_IMAGE_SIZE(img));
  if (!png_image_finish_read(&img, nullptr, out->pixels.data(), 0, nullptr)) {
    const std::string msg = img.message;
    png_image_free(&img);
    return Status::Corruption(what + ": damaged PNG (" + msg + ")");
  }
  return Status::OK();
}

// ---- JPEG (libjpeg API). libjpeg reports a fatal error by calling error_exit, which must not
// return: it longjmps back to the setjmp of the function below that called libjpeg. Those
// functions hold no C++ object with a destructor in their own frame, so the jump skips none.

struct JpegErrors {
  jpeg_error_mgr mgr;  // first member: libjpeg hands &mgr back as cinfo->err
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  bool warned = false;
  char message[JMSG_LENGTH_MAX] = "";
};

void OnJpegError(j_common_ptr c) {
  JpegErrors* e = reinterpret_cast<JpegErrors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

void OnJpegMessage(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace output
  JpegErrors* e = reinterpret_cast<JpegErrors*>(c->err);
  if (!e->warned) (*c->err->format_message)(c, e->message);  // keep the first warning
  e->warned = true;
}

// Caps progressive scans, as TurboJPEG's TJFLAG_LIMITSCANS does.
void OnJpegProgress(j_common_ptr c) {
  if (c->is_decompressor &&
      reinterpret_cast<j_decompress_ptr>(c)->input_scan_number > image_limits::kMaxScans) {
    JpegErrors* e = reinterpret_cast<JpegErrors*>(c->err);
    std::snprintf(e->message, sizeof(e->message), "more than %d progressive scans",
                  image_limits::kMaxScans);
    std::longjmp(e->jump, 1);
  }
}

void InitJpeg(jpeg_decompress_struct* cinfo, JpegErrors* e) {
  cinfo->err = jpeg_std_error(&e->mgr);
  e->mgr.error_exit = OnJpegError;
  e->mgr.emit_message = OnJpegMessage;
  e->progress.progress_monitor = OnJpegProgress;
}

// What JpegDecode produced: [x0, x0 + width) x [y0, y0 + height) of the full_width x full_height
// decoded image, `channels` (3 RGB or 4 CMYK as stored) per pixel.
struct JpegOut {
  int full_width, full_height, x0, y0, width, height, channels;
};

// Decodes at 1/denom, over `region` (+ margin) when given, into *buf (which lives in the caller's
// frame); with buf null, only reads the header (out->full_width, full_height: the full size).
// False (e->message says why) on a fatal error, or bytes that are not a JPEG.
bool JpegDecode(const uint8_t* data, size_t size, int denom, const SourceRegion* region, int margin,
                JpegErrors* e, std::vector<uint8_t>* buf, JpegOut* out) {
  jpeg_decompress_struct cinfo;
  InitJpeg(&cinfo, e);
  if (setjmp(e->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  cinfo.progress = &e->progress;
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (buf == nullptr) {
    out->full_width = static_cast<int>(cinfo.image_width);
    out->full_height = static_cast<int>(cinfo.image_height);
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;  // libjpeg converts grey and YCbCr to RGB
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(denom);
  jpeg_start_decompress(&cinfo);
  const int fw = static_cast<int>(cinfo.output_width), fh = static_cast<int>(cinfo.output_height);
  int x0 = 0, y0 = 0, x1 = fw, y1 = fh;
  if (region != nullptr) {
    const double sx = static_cast<double>(fw) / cinfo.image_width;
    const double sy = static_cast<double>(fh) / cinfo.image_height;
    // One more column each side: the edge columns of a cropped decode are upsampled without
    // their outer neighbour; JpegTrimEdges drops them.
    x0 = std::clamp(static_cast<int>(std::floor(region->x0 * sx)) - margin - 1, 0, fw - 1);
    y0 = std::clamp(static_cast<int>(std::floor(region->y0 * sy)) - margin, 0, fh - 1);
    x1 = std::clamp(static_cast<int>(std::ceil(region->x1 * sx)) + margin + 1, x0 + 1, fw);
    y1 = std::clamp(static_cast<int>(std::ceil(region->y1 * sy)) + margin, y0 + 1, fh);
  }
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), width = static_cast<JDIMENSION>(x1 - x0);
  if (static_cast<int>(width) < fw) jpeg_crop_scanline(&cinfo, &xoff, &width);  // whole iMCUs
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));
  const int channels = cmyk ? 4 : 3;
  const size_t stride = static_cast<size_t>(width) * channels;
  buf->resize(stride * static_cast<size_t>(y1 - y0));
  while (cinfo.output_scanline < static_cast<JDIMENSION>(y1)) {
    JSAMPROW row = buf->data() + (cinfo.output_scanline - y0) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  *out = {fw, fh, static_cast<int>(xoff), y0, static_cast<int>(width), y1 - y0, channels};
  jpeg_destroy_decompress(&cinfo);  // also abandons the rows below the region
  return true;
}

// A cropped decode (jpeg_crop_scanline) upsamples its first and last columns without their outer
// neighbour, so they can differ from a whole decode: drop each one that is not an image edge.
void JpegTrimEdges(std::vector<uint8_t>* buf, JpegOut* j) {
  const int left = j->x0 > 0 ? 1 : 0;
  const int right = j->x0 + j->width < j->full_width ? 1 : 0;
  const int width = j->width - left - right;
  if (width <= 0 || (left == 0 && right == 0)) return;
  const size_t in_stride = static_cast<size_t>(j->width) * j->channels;
  const size_t out_stride = static_cast<size_t>(width) * j->channels;
  uint8_t* p = buf->data();
  for (int y = 0; y < j->height; ++y) {  // forward: each row moves to a lower address
    std::memmove(p + y * out_stride, p + y * in_stride + left * j->channels, out_stride);
  }
  buf->resize(out_stride * j->height);
  j->x0 += left;
  j->width = width;
}

}  // namespace

int JpegScaleDenominator(double crop_width, double crop_height, int need) {
  for (int d : {8, 4, 2}) {
    if (crop_width / d >= need && crop_height / d >= need) return d;
  }
  return 1;
}

Status ImageDecoder::ReadHeader(const uint8_t* data, size_t size, const std::string& what,
                                ImageFormat* format, int* width, int* height) {
  if (size > image_limits::kMaxFileBytes) {
    return Status::Corruption(what + ": " + std::to_string(size) + " bytes, over the " +
                              std::to_string(image_limits::kMaxFileBytes) + "-byte limit");
  }
  if (IsPng(data, size)) {
    png_image img;
    Status s = PngHeader(data, size, what, &img);
    png_image_free(&img);
    EDL_RETURN_IF_ERROR(s);
    *format = ImageFormat::kPng;
    *width = static_cast<int>(img.width);
    *height = static_cast<int>(img.height);
    return Status::OK();
  }
  JpegErrors e;
  JpegOut j{};
  if (!JpegDecode(data, size, 1, nullptr, 0, &e, nullptr, &j)) {
    return Status::Corruption(what + ": neither a JPEG nor a PNG (" + e.message + ")");
  }
  EDL_RETURN_IF_ERROR(CheckSize(what, j.full_width, j.full_height));
  *format = ImageFormat::kJpeg;
  *width = j.full_width;
  *height = j.full_height;
  return Status::OK();
}

Status ImageDecoder::Decode(const uint8_t* data, size_t size, const std::string& what,
                            int scale_denom, RgbImage* out, bool* damaged,
                            const SourceRegion* region, int margin) {
  *damaged = false;
  ImageFormat format;
  int w = 0, h = 0;
  EDL_RETURN_IF_ERROR(ReadHeader(data, size, what, &format, &w, &h));
  if (format == ImageFormat::kPng) return DecodePng(data, size, what, out);
  const int d = scale_denom == 2 || scale_denom == 4 || scale_denom == 8 ? scale_denom : 1;
  JpegErrors e;
  JpegOut j;
  if (!JpegDecode(data, size, d, region, std::max(margin, 0), &e, &out->pixels, &j)) {
    return Status::Corruption(what + ": undecodable JPEG (" + e.message + ")");
  }
  *damaged = e.warned;  // e.g. premature end of data: decoded, the rest left grey
  JpegTrimEdges(&out->pixels, &j);
  out->full_width = j.full_width;
  out->full_height = j.full_height;
  out->x0 = j.x0;
  out->y0 = j.y0;
  out->width = j.width;
  out->height = j.height;
  if (j.channels == 4) {
    // Adobe CMYK JPEGs (Photoshop, PIL) store inverted inks: the stored value is 255 - ink, so
    // RGB = stored(C,M,Y) * stored(K) / 255, as PIL's CMYK -> RGB conversion gives. In place:
    // pixel p is read (bytes 4p..4p+3) before bytes 3p..3p+2 are written, and later pixels sit
    // further on.
    uint8_t* px = out->pixels.data();
    const size_t n = static_cast<size_t>(j.width) * j.height;
    for (size_t p = 0; p < n; ++p) {
      const unsigned c = px[4 * p], m = px[4 * p + 1], y = px[4 * p + 2], k = px[4 * p + 3];
      px[3 * p] = static_cast<uint8_t>((c * k + 127) / 255);
      px[3 * p + 1] = static_cast<uint8_t>((m * k + 127) / 255);
      px[3 * p + 2] = static_cast<uint8_t>((y * k + 127) / 255);
    }
    out->pixels.resize(n * 3);
  }
  return Status::OK();
}

}  // namespace edl::resnet50
