// `edl launch`: N local trainers with no server, like `torchrun --standalone` (static mode).
//
//   edl launch -n N [--log_dir D] [--master_port P] [--stop_grace_s S] [--tee] -- CMD ARGS...
//
// Trainer r gets RANK=r, LOCAL_RANK=r, WORLD_SIZE=LOCAL_WORLD_SIZE=N, MASTER_ADDR=127.0.0.1, a free
// MASTER_PORT (or --master_port), EDL_JOB_ID=local, EDL_TRAINER_ID=local-<r>, EDL_SLOT=r,
// EDL_GENERATION=0 and no EDL_CLIENT_SOCKET (the elastic runtime then runs in static mode). Each
// trainer logs to D/trainer-<r>.log (default ./edl-logs/launch-<time>/); --tee also prints each
// line on stdout prefixed with "[rank r] ". It waits for all trainers; when one fails it stops the
// rest (SIGTERM, --stop_grace_s, SIGKILL) and exits with the failed rank's status (its exit code,
// or 128 + signal). SIGINT/SIGTERM/SIGHUP stop every trainer the same way and exit 128 + signal.
// Usage errors exit 2.
//
// Thread-safety: RunLaunchMain blocks signals in the calling thread; call it from main() only.
#pragma once

namespace edl::launcher {

// argv[0] is "launch". Returns the process exit code.
int RunLaunchMain(int argc, char** argv);

}  // namespace edl::launcher
