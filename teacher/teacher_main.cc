// `edl teacher`: flags -> the students' dataset -> the teacher model from its checkpoint store
// (resnet50/distill_main.h LoadTeacherModel) -> TeacherServer (listen, optionally register with
// an edl server) -> run until SIGINT / SIGTERM, logging the load now and then.
#include "teacher/teacher_main.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>

#include <glog/logging.h>

#include "edl/base/flags.h"
#include "edl/net/auth.h"
#include "resnet50/distill_main.h"
#include "teacher/teacher_server.h"

namespace edl::teacher {

namespace {

struct Config {
  resnet50::TeacherModelOptions model;
  TeacherServerOptions server;
  std::string register_with, advertise_host = "127.0.0.1", secret_file, port_file;
  double log_every_s = 30;
  int64_t exit_with_parent = 0;  // > 0: stop once our parent is no longer this pid
};

po::options_description Flags(Config* c) {
  po::options_description d("edl teacher flags");
  resnet50::AddDataFlags(&d, &c->model.data);
  d.add_options()("model", po::value(&c->model.model)->default_value("resnet56"),
                  "the teacher's architecture")(
      "checkpoint_dir", po::value(&c->model.checkpoint_dir)->default_value(""),
      "RocksDB checkpoint store of the trained teacher (`edl train --checkpoint_dir`); required")(
      "seed", po::value(&c->model.seed)->default_value(1, "1"),
      "synthetic data: the students' --seed")(
      "batch_size", po::value(&c->model.batch)->default_value(128, "128"),
      "synthetic data: the students' --batch_size (sets the default sizes)")(
      "device", po::value(&c->model.device)->default_value("cpu"), "cpu|cuda|auto")(
      "threads", po::value(&c->model.threads)->default_value(0),
      "CPU compute threads; 0 = all cores")(
      "service", po::value(&c->server.service)->default_value(""), "service name; required")(
      "name", po::value(&c->server.name)->default_value(""),
      "this teacher's name in the service; default teacher-<pid>")(
      "bind", po::value(&c->server.bind_host)->default_value("0.0.0.0"), "address to listen on")(
      "port", po::value(&c->server.port)->default_value(0), "port to listen on; 0 = any free one")(
      "port_file", po::value(&c->port_file)->default_value(""),
      "write the port listened on to this file once serving (scripts, tests)")(
      "server", po::value(&c->register_with)->default_value(""),
      "HOST:PORT of the edl server to register with (students find the teacher there); empty = "
      "none")("advertise_host", po::value(&c->advertise_host)->default_value("127.0.0.1"),
              "the address students reach this teacher at (sent to the server)")(
      "secret_file", po::value(&c->secret_file)->default_value(""),
      "cluster secret (default $HOME/.edl/secret)")(
      "max_batch", po::value(&c->server.max_batch)->default_value(1024),
      "most samples in one forward pass (concurrent requests are batched up to it)")(
      "max_students", po::value(&c->server.max_students)->default_value(64), "concurrent students")(
      "exit_with_parent", po::value(&c->exit_with_parent)->default_value(0),
      "PID: stop when the parent process is no longer PID (the edl client that started this "
      "teacher "
      "sets it, so a killed client leaves no teacher behind); 0 = never")(
      "log_every_s", po::value(&c->log_every_s)->default_value(30, "30"),
      "log the request rate and latency this often; 0 = never");
  return d;
}

int Fail(const Status& s) {
  std::cerr << "edl teacher: " << s.ToString() << "\n";
  return 2;
}

}  // namespace

int RunTeacherMain(int argc, char** argv) {
  Config c;
  po::options_description desc = Flags(&c);
  ParsedFlags parsed;
  Status s = ParseFlags("teacher",
                        "usage: edl teacher --service NAME --checkpoint_dir DIR [flags]\n"
                        "Serves a trained model's logits to distilling students (`edl train "
                        "--distill NAME`).",
                        desc, argc, argv, &parsed);
  if (!s.ok()) return Fail(s);
  if (parsed.help) return 0;
  if (c.server.service.empty() || !proto::IsValidName(c.server.service)) {
    return Fail(
        Status::InvalidArgument("--service must be a name (letters, digits, '.', '_', '-')"));
  }
  if (c.server.name.empty()) c.server.name = "teacher-" + std::to_string(::getpid());
  if (!proto::IsValidName(c.server.name))
    return Fail(Status::InvalidArgument("--name is not a valid name"));
  if (c.server.max_batch < 1 || c.server.max_students < 1) {
    return Fail(Status::InvalidArgument("--max_batch and --max_students must be >= 1"));
  }
  if (s = resnet50::ValidateDataFlags(c.model.data); !s.ok()) return Fail(s);
  if (c.secret_file.empty()) c.secret_file = net::DefaultSecretFile();
  if (s = net::ReadSecretFile(c.secret_file, &c.server.secret); !s.ok()) return Fail(s);
  // SIGINT / SIGTERM are taken by sigtimedwait below: block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto model = resnet50::LoadTeacherModel(c.model);
  if (!model.ok()) return Fail(model.status());
  resnet50::Trainer* t = model.value().get();
  const int64_t train_size = t->train_size();
  InferFn infer = [t](const std::vector<const proto::TeacherRequest*>& reqs,
                      std::vector<float>* logits) {
    std::vector<resnet50::Trainer::TrainBatch> batches;
    for (const proto::TeacherRequest* r : reqs) {
      resnet50::Trainer::TrainBatch b;
      b.indices = &r->indices;
      b.aug_seed = r->aug_seed;
      b.augment.random_crop = r->random_crop;
      b.augment.pad = r->pad;
      b.augment.flip = r->flip;
      batches.push_back(b);
    }
    return t->InferTrain(batches, logits);
  };
  CheckFn check = [train_size](const proto::TeacherRequest& r) {
    for (int64_t i : r.indices) {
      if (i >= train_size) {
        return Status::InvalidArgument("sample " + std::to_string(i) +
                                       " is outside this teacher's " + std::to_string(train_size) +
                                       " training samples: give it the students' --data flags");
      }
    }
    return Status::OK();
  };
  TeacherServer server(c.server, t->train_data().num_classes(), infer, check);
  if (s = server.Start(); !s.ok()) return Fail(s);
  if (!c.register_with.empty()) {
    if (s = server.Register(c.register_with, c.advertise_host); !s.ok()) return Fail(s);
  }
  std::cout << "edl teacher: " << c.server.name << " serving " << c.model.model << " ("
            << t->train_data().name() << ", " << t->train_data().num_classes()
            << " classes) for service " << c.server.service << " on port " << server.port()
            << ", device " << t->backend()->name() << ", threads " << t->threads() << std::endl;
  if (!c.port_file.empty()) {
    const std::string tmp = c.port_file + ".tmp";
    std::ofstream(tmp) << server.port() << "\n";
    std::rename(tmp.c_str(), c.port_file.c_str());  // readers never see a partial file
  }
  int64_t since_log = 0;
  while (true) {
    timespec ts{1, 0};
    const int sig = sigtimedwait(&stop_signals, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) {
      LOG(INFO) << "edl teacher: signal " << sig << ", stopping";
      break;
    }
    if (c.exit_with_parent > 0 && ::getppid() != c.exit_with_parent) {
      LOG(WARNING) << "edl teacher: parent " << c.exit_with_parent
                   << " (its edl client) is gone; stopping";
      break;
    }
    if (c.log_every_s > 0 && ++since_log >= c.log_every_s) {
      since_log = 0;
      const TeacherStats tot = server.Totals();
      LOG(INFO) << "edl teacher: " << tot.requests << " requests, " << tot.samples << " samples in "
                << tot.passes << " passes, mean latency "
                << (tot.requests ? tot.latency_ms_sum / tot.requests : 0)
                << " ms, dropped unanswered " << tot.cancelled << " cancelled + " << tot.orphaned
                << " of closed connections";
    }
  }
  server.Stop();
  return 0;
}

}  // namespace edl::teacher
