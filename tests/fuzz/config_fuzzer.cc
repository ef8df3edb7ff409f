// INI config reader (edl/base/flags.h): the file given to --config. The bytes go through the real
// entry point, ParseFlags("... --config FILE"), from an in-memory file (memfd), against flags of
// every value type the subcommands use. Whatever the file holds, ParseFlags returns a Status (an
// exception escaping it would abort the fuzzer), and flags given on the command line win.
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "edl/base/flags.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace po = boost::program_options;

int ConfigFd() {
  static const int fd = memfd_create("edl_fuzz_config", 0);
  FUZZ_CHECK(fd >= 0);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ConfigFd();
  FUZZ_CHECK(ftruncate(fd, 0) == 0);
  FUZZ_CHECK(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  std::string job_id, checkpoint_dir;
  int port = 0;
  int64_t max_steps = 0;
  double lr = 0;
  bool verbose = false;
  std::vector<std::string> peers;
  std::vector<int> slots;
  po::options_description desc("fuzz");
  desc.add_options()("job_id", po::value<std::string>(&job_id)->default_value("job"), "")(
      "checkpoint_dir", po::value<std::string>(&checkpoint_dir), "")(
      "port", po::value<int>(&port)->default_value(7164), "")(
      "max_steps", po::value<int64_t>(&max_steps), "")("lr", po::value<double>(&lr), "")(
      "verbose", po::bool_switch(&verbose), "")("peer", po::value<std::vector<std::string>>(&peers),
                                                "")(
      "slots", po::value<std::vector<int>>(&slots)->multitoken(), "");

  std::string config_arg = path;
  std::vector<char*> argv = {const_cast<char*>("fuzz"), const_cast<char*>("--config"),
                             config_arg.data(), const_cast<char*>("--port=9")};
  edl::ParsedFlags flags;
  const edl::Status s =
      edl::ParseFlags("fuzz", "usage", desc, static_cast<int>(argv.size()), argv.data(), &flags);
  if (s.ok()) {
    FUZZ_CHECK(port == 9);  // the command line wins over the file
    FUZZ_CHECK(flags.config_file == path);
  } else {
    FUZZ_CHECK(!s.ToString().empty());
  }
  return 0;
}
