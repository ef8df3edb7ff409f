// examples/pytorch/train_inplace.py (edl.torch over the C++ runtime; Debian's python3-torch, CPU,
// Gloo) as real processes, without a server: alone (world size 1, and it says so), the binding's
// refusals of bad use, and under `edl launch` against plain DDP (train_ddp.py) from the same seed.
// pytorch_inplace_job_test runs it under a server and clients.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/pytorch/inplace_fixture.h"

namespace edl {
namespace {

using itest::Slurp;
using pytorch_test::Example;
using pytorch_test::Python;
using pytorch_test::PyTorchInPlaceTest;

TEST_F(PyTorchInPlaceTest, RunsAloneAtWorldSizeOneAndSaysSo) {
  std::string out;
  ASSERT_EQ(
      Run({Python(), Example("train_inplace.py"), "--train_samples", "128", "--batch_size", "16",
           "--steps", "3", "--test_samples", "64", "--threads", "1", "--log_every", "1"},
          "alone", &out),
      0)
      << out;
  EXPECT_NE(out.find("standalone mode: no launcher, so world size 1"), std::string::npos) << out;
  EXPECT_NE(out.find("finished at step 3, generation 1, world 1"), std::string::npos) << out;
  EXPECT_NE(out.find("eval after step 3"), std::string::npos) << "the end's evaluation" << out;
}

// The binding's own checks, through edl._edl directly (a Trainable subclass without edl.torch):
// each bad use is one clear Python error, raised in the caller, never a crash.
TEST_F(PyTorchInPlaceTest, TheBindingRefusesBadUseWithClearErrors) {
  const std::string script = R"(
import edl, numpy as np
class T(edl.Trainable):
    def __init__(self, reply):
        super().__init__()
        self.reply = reply
        self.w = np.zeros(8, np.float32)
        self.g = np.zeros(8 + edl.Trainable.inband_slots, np.float32)
        self.set_state([("w", self.w, self.w.ctypes.data, [8], "float32", 32, False)])
        self.set_gradients(self.g, self.g.ctypes.data, 8)
        self.set_sizes(16, 0)
        self.set_fingerprint("test")
    def forward_backward(self, indices):
        return self.reply(indices)
    def apply_update(self, lr):
        pass
    def evaluate(self, indices):
        return 0.0, 0, 0
def run(t):
    o = edl.RunOptions(); o.batch = 4; o.max_steps = 2
    try:
        edl.run(t, o, None, None)
        return "no error"
    except edl.TrainingError as e:
        return "TrainingError: %s; cause %r" % (e, e.__cause__)
print(run(T(lambda i: (float(len(i)), 0, len(i), 0))))
print(run(T(lambda i: None)))
print(run(T(lambda i: 1 / 0)))
t = T(lambda i: None)
for bad in [("b", t.w, t.w.ctypes.data, [8], "bool", 8, False),
            ("w2", t.w, t.w.ctypes.data, [8], "float32", 16, False)]:
    try:
        t.set_state([bad])
    except ValueError as e:
        print("ValueError:", e)
class Empty(edl.Trainable):
    pass
e = Empty(); e.set_gradients(t.g, t.g.ctypes.data, 8); e.set_sizes(16, 0)
print(run(e))
)";
  std::string out;
  ASSERT_EQ(Run({Python(), "-c", script}, "binding", &out), 0) << out;
  for (const char* want :
       {"no error\n",
        "TrainingError: Aborted: forward_backward() returned a value of the wrong type",
        "TrainingError: Aborted: forward_backward() raised ZeroDivisionError: division by zero; "
        "cause ZeroDivisionError('division by zero')",
        "ValueError: state tensor 'b' has dtype bool, which edl cannot carry",
        "ValueError: state tensor 'w2': 16 bytes registered for its shape and dtype",
        "TrainingError: InvalidArgument: the edl.Trainable subclass defines no "
        "forward_backward()"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  }
}

// The parity check: the same seed, model, data order (train_ddp.py trains the global batches the
// in-place run's sample log lists) and hyper-parameters, 2 ranks each under `edl launch`: the
// parameters, BatchNorm statistics and step counts after N steps agree within float tolerance.
TEST_F(PyTorchInPlaceTest, MatchesPlainDdpFromTheSameSeed) {
  constexpr int kSteps = 12;
  const std::vector<std::string> common = {"--train_samples",
                                           "512",
                                           "--steps",
                                           std::to_string(kSteps),
                                           "--lr",
                                           "0.05",
                                           "--lr_decay",
                                           "constant",
                                           "--threads",
                                           "1",
                                           "--seed",
                                           "7",
                                           "--test_samples",
                                           "0"};
  std::vector<std::string> inplace = {test::EdlBinary(),
                                      "launch",
                                      "-n",
                                      "2",
                                      "--log_dir",
                                      dir_.Join("inplace-logs"),
                                      "--",
                                      Python(),
                                      Example("train_inplace.py"),
                                      "--batch_size",
                                      "16",
                                      "--sample_log",
                                      dir_.Join("samples.jsonl"),
                                      "--save_model",
                                      dir_.Join("inplace.pt"),
                                      "--workers",
                                      "0"};
  inplace.insert(inplace.end(), common.begin(), common.end());
  std::string out;
  ASSERT_EQ(Run(inplace, "inplace", &out), 0)
      << out << Slurp(dir_.Join("inplace-logs/trainer-0.log"), 4000);
  EXPECT_NE(Slurp(dir_.Join("inplace-logs/trainer-0.log"))
                .find("static mode: rank 0 of a fixed world of 2"),
            std::string::npos);
  std::vector<std::string> ddp = {test::EdlBinary(),
                                  "launch",
                                  "-n",
                                  "2",
                                  "--log_dir",
                                  dir_.Join("ddp-logs"),
                                  "--",
                                  Python(),
                                  Example("train_ddp.py"),
                                  "--batch_size",
                                  "32",
                                  "--sample_order",
                                  dir_.Join("samples.jsonl"),
                                  "--checkpoint_dir",
                                  dir_.Join("ddp")};
  ddp.insert(ddp.end(), common.begin(), common.end());
  ASSERT_EQ(Run(ddp, "ddp", &out), 0) << out << Slurp(dir_.Join("ddp-logs/trainer-0.log"), 4000);

  const std::string compare = R"(
import sys, torch
a = torch.load(sys.argv[1]); b = torch.load(sys.argv[2])["model"]
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
worst = max(((x.double() - b[k].double()).abs().max().item(), k) for k, x in a.items())
print("max abs difference %.3g (%s) over %d tensors" % (worst[0], worst[1], len(a)))
start = torch.load(sys.argv[3])
moved = max((x.double() - y.double()).abs().max().item()
            for x, y in zip(a.values(), start.values()) if x.is_floating_point())
print("max abs change by training %.3g" % moved)
ok = all(torch.allclose(x.double(), b[k].double(), rtol=1e-4, atol=1e-5) for k, x in a.items())
sys.exit(0 if ok and moved > 1e-3 else 1)
)";
  // The initial parameters (seed 7), to show that training moved them well beyond the tolerance.
  const std::string init =
      "import sys, torch; sys.path.insert(0, sys.argv[1]); "
      "import resnet20_fashion as r; torch.manual_seed(7); "
      "torch.save(r.ResNet20().state_dict(), sys.argv[2])";
  ASSERT_EQ(
      Run({Python(), "-c", init, test::SourceDir() + "/examples/pytorch", dir_.Join("init.pt")},
          "init", &out),
      0)
      << out;
  const int rc = Run({Python(), "-c", compare, dir_.Join("inplace.pt"),
                      dir_.Join("ddp/checkpoint.pt"), dir_.Join("init.pt")},
                     "compare", &out);
  std::cout << out;
  EXPECT_EQ(rc, 0) << out;
}

}  // namespace
}  // namespace edl
