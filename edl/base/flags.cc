#include "edl/base/flags.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <glog/logging.h>

namespace edl {
namespace {

constexpr size_t kMaxConfigBytes = 1 << 20;

// Boost.Program_options (1.74) fills in its error messages by replacing "%option%"-style tokens
// until none is left, so a flag name or value that itself holds such a token hangs the parser in
// the error path (found by tests/fuzz/config_fuzzer.cc). Such text is refused before Boost sees it.
Status CheckNoPlaceholder(const std::string& text, const std::string& where) {
  for (size_t a = text.find('%'); a != std::string::npos; a = text.find('%', a + 1)) {
    size_t b = a + 1;
    while (b < text.size() && (std::isalnum(static_cast<unsigned char>(text[b])) || text[b] == '_')) {
      ++b;
    }
    if (b > a + 1 && b < text.size() && text[b] == '%') {
      return Status::InvalidArgument(where + " holds '" + text.substr(a, b - a + 1) +
                                     "', which the flag parser cannot handle; remove the '%' signs");
    }
  }
  return Status::OK();
}

}  // namespace

Status ParseFlags(const std::string& command, const std::string& usage,
                  const po::options_description& desc, int argc, char** argv, ParsedFlags* out,
                  const po::positional_options_description* positional) {
  po::options_description all("edl " + command + " flags");
  all.add_options()("help", "print this help and exit")(
      "config", po::value<std::string>(&out->config_file),
      "INI file with the same keys as the flags (key = value); flags win over it");
  all.add(desc);
  const std::string hint = " (see `edl " + command + " --help`)";
  for (int i = 1; i < argc; ++i) {
    EDL_RETURN_IF_ERROR(CheckNoPlaceholder(argv[i], "command-line argument " + std::to_string(i)));
  }
  try {
    po::command_line_parser parser(argc, argv);
    parser.options(all);
    if (positional != nullptr) parser.positional(*positional);
    po::store(parser.run(), out->vm);
    if (out->vm.count("help")) {
      out->help = true;
      std::cout << usage << "\n\n" << all << std::endl;
      return Status::OK();
    }
    if (out->vm.count("config")) {
      const std::string path = out->vm["config"].as<std::string>();
      std::ifstream file(path, std::ios::binary);
      if (!file) {
        return Status::InvalidArgument("--config " + path +
                                       ": cannot open the file; check the path and permissions");
      }
      std::string text(kMaxConfigBytes + 1, '\0');
      file.read(text.data(), static_cast<std::streamsize>(text.size()));
      text.resize(static_cast<size_t>(file.gcount()));
      if (text.size() > kMaxConfigBytes) {
        return Status::InvalidArgument("config file " + path + " is larger than 1 MiB; is it the " +
                                       "right file?");
      }
      EDL_RETURN_IF_ERROR(CheckNoPlaceholder(text, "config file " + path));
      std::istringstream in(text);
      try {
        po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), out->vm);
      } catch (const po::error& e) {
        return Status::InvalidArgument("config file " + path + ": " + e.what() + hint);
      }
    }
    po::notify(out->vm);
  } catch (const po::error& e) {
    return Status::InvalidArgument(std::string(e.what()) + hint);
  }
  return Status::OK();
}

Status UseLogDir(const std::string& dir) {
  if (dir.empty()) return Status::InvalidArgument("--log_dir is empty: give a directory");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return Status::InvalidArgument("--log_dir " + dir + ": cannot create the directory (" +
                                   (ec ? ec.message() : std::string("not a directory")) +
                                   "); choose a writable one");
  }
  FLAGS_log_dir = dir;
  FLAGS_logtostderr = false;
  FLAGS_alsologtostderr = true;
  FLAGS_logbufsecs = 0;  // every line reaches the file at once (glog buffers INFO lines otherwise)
  return Status::OK();
}

}  // namespace edl
