// `edl server`: flags, config file and signal handling around jobserver::Server.
#pragma once

#include "jobserver/ctl/ctl_main.h"  // edl/main.cc includes only this header for both subcommands

namespace edl::jobserver {
// argv[0] is "server". Returns the process exit code (0 after `edl ctl stop` or, with
// --exit_when_done, once the job finished; 2 on bad flags; 1 on other errors).
int RunServerMain(int argc, char** argv);
}  // namespace edl::jobserver
