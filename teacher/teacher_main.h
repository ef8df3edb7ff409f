// `edl teacher`: serves a trained model's logits to distilling students (teacher_server.h).
#pragma once

namespace edl::teacher {

// argv[0] is "teacher". Exit code 0 after SIGINT / SIGTERM, 2 when the setup fails (flags, data,
// checkpoint, a model that does not match the data, the port, the server).
int RunTeacherMain(int argc, char** argv);

}  // namespace edl::teacher
