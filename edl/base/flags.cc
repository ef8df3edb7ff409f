#include "edl/base/flags.h"

#include <fstream>
#include <iostream>

namespace edl {

Status ParseFlags(const std::string& command, const std::string& usage,
                  const po::options_description& desc, int argc, char** argv, ParsedFlags* out,
                  const po::positional_options_description* positional) {
  po::options_description all("edl " + command + " flags");
  all.add_options()("help", "print this help and exit")(
      "config", po::value<std::string>(&out->config_file),
      "INI file with the same keys as the flags (key = value); flags win over it");
  all.add(desc);
  const std::string hint = " (see `edl " + command + " --help`)";
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
      std::ifstream in(path);
      if (!in) {
        return Status::InvalidArgument("--config " + path +
                                       ": cannot open the file; check the path and permissions");
      }
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

}  // namespace edl
