// `edl launch`: torchrun's command line (flags in launch_options.h).
//
//   edl launch -n N [--nnodes MIN:MAX] [--rdzv_endpoint HOST:PORT] [--rdzv_id ID]
//              [--max_restarts K] [--log_dir D] [--master_port P] [--stop_grace_s S] [--tee] -- CMD
//
// A local job (no --rdzv_endpoint), like `torchrun --standalone`: trainer r gets RANK=r,
// LOCAL_RANK=r, WORLD_SIZE=LOCAL_WORLD_SIZE=N, GROUP_RANK=0, MASTER_ADDR=127.0.0.1, a free
// MASTER_PORT (or --master_port), EDL_JOB_ID=TORCHELASTIC_RUN_ID=ID (default "local"),
// EDL_TRAINER_ID=local-<r>, EDL_SLOT=r, EDL_GENERATION=0, TORCHELASTIC_RESTART_COUNT, and no
// EDL_CLIENT_SOCKET (the elastic runtime then runs in static mode). Each trainer logs to
// D/trainer-<r>.log (default ./edl-logs/launch-<time>/, appended across restarts); --tee also
// prints each line on stdout prefixed with "[rank r] ". When one trainer fails it stops the rest
// (SIGTERM, --stop_grace_s, SIGKILL); while restarts are left (--max_restarts) it starts every
// trainer again (a fresh MASTER_PORT and rendezvous directory), else it exits with the failed
// rank's status (its exit code, or 128 + signal). SIGINT/SIGTERM/SIGHUP stop every trainer the
// same way and exit 128 + signal. Usage errors exit 2.
//
// With --rdzv_endpoint it execs `edl client` (the same binary) joining that server in restart
// mode with N CPU slots: the server sizes the job and restarts the trainers on every change.
//
// Thread-safety: RunLaunchMain blocks signals in the calling thread; call it from main() only.
#pragma once

namespace edl::launcher {

// argv[0] is "launch". Returns the process exit code.
int RunLaunchMain(int argc, char** argv);

}  // namespace edl::launcher
