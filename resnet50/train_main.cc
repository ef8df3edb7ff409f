#include "resnet50/train_main.h"

#include <iostream>

namespace edl::resnet50 {
int RunTrainMain(int argc, char** argv) {
  std::cerr << "edl train: not built yet\n";
  return 2;
}
}  // namespace edl::resnet50
