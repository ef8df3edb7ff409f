// `edl ctl status [--json] | scale N | watch | stop`: talks to a running `edl server`.
#pragma once

namespace edl::jobserver {
// argv[0] is "ctl". Returns the process exit code (0 ok, 1 server error, 2 bad usage).
int RunCtlMain(int argc, char** argv);
}  // namespace edl::jobserver
