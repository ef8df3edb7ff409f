// `edl train`: the reference ResNet trainer run standalone (world size 1). Flags: `edl train
// --help`.
#pragma once

namespace edl::resnet50 {

// argv[0] is the subcommand name. Returns the process exit code: 0 on success, 2 on bad flags or
// bad input (missing/corrupt data files, unsupported image size, ...), 1 on a runtime failure.
int RunTrainMain(int argc, char** argv);

}  // namespace edl::resnet50
