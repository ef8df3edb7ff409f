// The `edl` binary: one executable for every role. It only dispatches: each subcommand's logic
// lives in its component's library, behind a Run...Main(argc, argv) whose argv[0] is the
// subcommand name and whose return value is the process exit code.
#include <csignal>
#include <cstring>
#include <iostream>
#include <string>

#include <glog/logging.h>

#include "edl/config.h"
#include "jobclient/client_main.h"
#include "jobserver/server_main.h"
#include "launcher/launch_main.h"
#include "resnet50/train_main.h"
#include "teacher/teacher_main.h"
#include "tools/ckpt_main.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* help;
};

const Subcommand kSubcommands[] = {
    {"server", edl::jobserver::RunServerMain, "job server: membership, generations, rendezvous KV"},
    {"ctl", edl::jobserver::RunCtlMain, "talk to a server: status | scale N | watch | stop"},
    {"client", edl::jobclient::RunClientMain, "per-node agent: starts and stops trainers"},
    {"launch", edl::launcher::RunLaunchMain,
     "torchrun's flags: N local trainers, or join a server"},
    {"train", edl::resnet50::RunTrainMain, "the reference ResNet trainer (CPU oneDNN / CUDA)"},
    {"teacher", edl::teacher::RunTeacherMain,
     "serve a trained model's logits to distilling students"},
    {"ckpt", edl::ckpt::RunCkptMain, "checkpoint store tools: ls | verify | export"},
};

void PrintUsage(std::ostream& os) {
  os << "edl " << EDL_VERSION
     << " — Elastic Deep Learning (CUDA backend: " << (EDL_HAVE_CUDA ? "built" : "not built")
     << ")\n\nusage: edl SUBCOMMAND [flags]\n\n";
  for (const Subcommand& s : kSubcommands) {
    os << "  " << s.name << std::string(10 - std::strlen(s.name), ' ') << s.help << "\n";
  }
  os << "\n`edl SUBCOMMAND --help` lists that subcommand's flags.\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a dead peer shows up as EPIPE, not a killed process
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    PrintUsage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::cout << "edl " << EDL_VERSION << "\n";
    return 0;
  }
  for (const Subcommand& s : kSubcommands) {
    if (std::strcmp(argv[1], s.name) == 0) return s.run(argc - 1, argv + 1);
  }
  std::cerr << "edl: unknown subcommand '" << argv[1] << "'\n\n";
  PrintUsage(std::cerr);
  return 2;
}
