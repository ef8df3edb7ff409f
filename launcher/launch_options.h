// `edl launch`'s command line, torchrun's flags included (docs/PYTORCH.md, "Migrating from
// torchrun"):
//
//   edl launch --nproc_per_node N [--nnodes MIN:MAX] [--rdzv_endpoint HOST:PORT] [--rdzv_id ID]
//              [--max_restarts K] [--standalone] [--rdzv_backend c10d|static|edl] -- CMD ARGS...
//
// Without --rdzv_endpoint it is a local job (one node, static world, like torchrun --standalone):
// --nnodes must admit 1 node, --rdzv_id is the job id (EDL_JOB_ID, TORCHELASTIC_RUN_ID), and a
// failed trainer restarts every trainer up to --max_restarts times. With --rdzv_endpoint the node
// joins that `edl server` as an `edl client` in restart mode with N CPU slots (LOCAL_RANK picks
// the device, as under torchrun); the server's own flags size the job, so --nnodes, --rdzv_id and
// --max_restarts only have to be consistent with it (ClientArgv's notes say how).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::launcher {

struct LaunchOptions {
  int num_trainers = 0;              // --nproc_per_node / -n
  int min_nodes = 1, max_nodes = 1;  // --nnodes N or MIN:MAX
  std::string rdzv_endpoint;         // HOST:PORT of an edl server; empty: a local job
  std::string rdzv_id = "local";     // job id of a local job
  std::string rdzv_backend;          // accepted for torchrun command lines; EDL is the backend
  bool standalone = false;           // torchrun --standalone: a local job (the default anyway)
  int max_restarts = 0;              // local job: restarts of the whole set after a failure
  std::string log_dir;
  int master_port = 0;
  double stop_grace_s = 10;
  bool tee = false;
  // Joining a server (with --rdzv_endpoint): the `edl client` flags of the same names.
  std::string secret_file;  // default $HOME/.edl/secret (what scripts/ssh_cluster.sh creates)
  std::string node_name;    // default this host's name
  std::string advertise_addr;
  std::vector<std::string> command;
};

// The usage text (also `edl launch --help`).
extern const char kLaunchUsage[];

// Parses argv (argv[0] is "launch") into *opts. InvalidArgument naming the bad flag and the fix;
// sets *help on --help (the usage is printed then).
Status ParseLaunchArgs(int argc, char** argv, LaunchOptions* opts, bool* help);

// "MIN:MAX" or "N" (torchrun's --nnodes) into *min / *max; InvalidArgument otherwise.
Status ParseNodeRange(const std::string& text, int* min, int* max);

// The `edl client` command line (after the binary's path) that joins opts.rdzv_endpoint.
std::vector<std::string> ClientArgv(const LaunchOptions& opts);

// What a torchrun user should know about the server's part when joining one: one line each.
std::vector<std::string> JoinNotes(const LaunchOptions& opts);

}  // namespace edl::launcher
