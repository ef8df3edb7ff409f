// Command-line flags plus an INI config file for every subcommand (Boost.Program_options).
// Flags use underscores (`--checkpoint_dir`) as PaddlePaddle EDL's did; the INI file uses the same
// keys (`checkpoint_dir = /mnt/ckpt`); flags win over the file. An unknown flag or key, a value
// of the wrong type, an abbreviated flag (`--slot` for `--slots`: never guessed) or a stray word a
// command takes no positional argument for is an InvalidArgument that names it and points at
// `--help`.
//
// Thread-safety: ParseFlags is reentrant; it touches no globals. UseLogDir sets glog's flags: call
// it from main's thread before other threads log.
#pragma once

#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "edl/base/status.h"

namespace edl {

namespace po = boost::program_options;

struct ParsedFlags {
  po::variables_map vm;
  bool help = false;        // --help was given; usage has been printed to stdout
  std::string config_file;  // value of --config, or empty
};

// Parses argv[1..argc) (argv[0] is the subcommand name, e.g. "server") against `desc`, to which
// `--help` and `--config FILE` are added. `usage` is printed above the option list on --help.
// `positional`, if not null, maps positional arguments to options.
Status ParseFlags(const std::string& command, const std::string& usage,
                  const po::options_description& desc, int argc, char** argv, ParsedFlags* out,
                  const po::positional_options_description* positional = nullptr);

// Splits a command line into words as a POSIX shell does, without any expansion: blanks (space,
// tab) separate words; '...' keeps everything in it; "..." keeps everything but a backslash
// before ", \, $ or ` (which it escapes); outside quotes a backslash keeps the next character
// (`/data/ckpt\ dir` is one word). InvalidArgument naming `what` (e.g. "--trainer_cmd") and the
// fix for an unterminated quote or a trailing backslash: never a guess at what was meant.
StatusOr<std::vector<std::string>> SplitCommandLine(const std::string& line,
                                                    const std::string& what);

// `--log_dir DIR`, which means the same for every role (docs/TROUBLESHOOTING.md, "Logs"):
// the directory of the log files this process writes. Its own glog files go there
// (edl.<host>.<user>.log.<LEVEL>.<time>.<pid>, edl.<LEVEL> links to the newest) while stderr
// still gets every line; a role that starts trainers (`edl client`, `edl launch`) also writes
// each trainer's output there. Creates DIR if missing; InvalidArgument naming it otherwise.
Status UseLogDir(const std::string& dir);

}  // namespace edl
