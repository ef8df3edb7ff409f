// `edl client`: flags, config file and signal handling around jobclient::Client.
#pragma once

namespace edl::jobclient {
// argv[0] is "client". Returns the exit code: 0 after `edl ctl stop`, a signal, or (with
// --exit_when_done) the job's end; 2 on bad flags or when the server refuses this node.
int RunClientMain(int argc, char** argv);
}  // namespace edl::jobclient
