// Compiled, not run (tests/edl/base/CMakeLists.txt): with EDL_DROP_STATUS the Status and the
// StatusOr below are dropped, which must not compile (Status and StatusOr are [[nodiscard]]);
// without it they are dropped on purpose, with (void), which must.
#include "edl/base/status.h"

namespace {

edl::Status Fails() { return edl::Status::Internal("dropped"); }
edl::StatusOr<int> FailsOr() { return edl::Status::Internal("dropped"); }

}  // namespace

int main() {
#ifdef EDL_DROP_STATUS
  Fails();
  FailsOr();
#else
  (void)Fails();
  (void)FailsOr();
#endif
  return 0;
}
