// `edl ckpt ls|verify|export`: inspect a checkpoint store (--checkpoint_dir) without a trainer.
//   ls      table of checkpoints (id, step, epoch, generation, world, time, size); --json for JSON
//   verify  checks every tensor checksum of --id N (default: every checkpoint); exit 1 when any
//           tensor is corrupt, naming it
//   export  writes checkpoint --id N (default: latest) as raw tensor files plus index.json to --out
// Opens the store read-only, so it works while a trainer is writing to it.
#pragma once

namespace edl::ckpt {

// argv[0] is "ckpt". Returns the process exit code (0 ok, 1 failure/corruption, 2 usage).
int RunCkptMain(int argc, char** argv);

}  // namespace edl::ckpt
