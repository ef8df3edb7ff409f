#include "edl/base/dtype.h"

#include <glog/logging.h>

namespace edl {

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kInt64:
      return 8;
    case DataType::kInt32:
      return 4;
    case DataType::kBFloat16:
      return 2;
    case DataType::kFloat16:
      return 2;
    case DataType::kUInt8:
      return 1;
  }
  LOG(FATAL) << "unknown DataType " << static_cast<int>(t);
  return 0;
}

}  // namespace edl
