#include "edl/base/flags.h"

#include <algorithm>
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
    while (b < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[b])) || text[b] == '_')) {
      ++b;
    }
    if (b > a + 1 && b < text.size() && text[b] == '%') {
      return Status::InvalidArgument(
          where + " holds '" + text.substr(a, b - a + 1) +
          "', which the flag parser cannot handle; remove the '%' signs");
    }
  }
  return Status::OK();
}

// Edits (insert, delete, replace) from a to b, stopping early past 3.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// "; did you mean --x or --y?" for an unknown `--name`: the flags it abbreviates or is a typo of
// (at most 2 edits); "" when none is close.
std::string Suggest(const po::options_description& all, const std::string& given) {
  std::string name = given;
  while (!name.empty() && name.front() == '-') name.erase(0, 1);
  if (name.empty()) return "";
  std::vector<std::string> close;
  for (const auto& opt : all.options()) {
    const std::string& flag = opt->long_name();
    if (flag.empty()) continue;
    if ((flag.size() > name.size() && flag.compare(0, name.size(), name) == 0) ||
        EditDistance(name, flag) <= 2) {
      close.push_back("--" + flag);
    }
  }
  if (close.empty() || close.size() > 4) return "";
  std::string s = "; did you mean ";
  for (size_t i = 0; i < close.size(); ++i) {
    s += (i == 0 ? "" : i + 1 == close.size() ? " or " : ", ") + close[i];
  }
  return s + "? (flags are never abbreviated)";
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
    // Exact flag names only: an abbreviation that means one flag today may mean another tomorrow.
    // Short flags only where a command has one (`edl launch -n`): elsewhere "-1" is a word (a
    // negative number the command then refuses by its meaning), not an unknown flag.
    int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    bool has_short = false;
    for (const auto& opt : all.options()) {
      const std::string shown = opt->format_name();
      has_short |= shown.size() > 1 && shown[0] == '-' && shown[1] != '-';
    }
    if (!has_short) style &= ~po::command_line_style::allow_short;
    parser.style(style);
    if (positional != nullptr) parser.positional(*positional);
    const po::parsed_options parsed = parser.run();
    for (const po::option& o : parsed.options) {
      // A word no flag takes and no positional argument is declared for (Boost drops it).
      if (o.position_key >= 0 && o.string_key.empty()) {
        const std::string word = o.value.empty() ? std::string() : o.value.front();
        return Status::InvalidArgument("unexpected argument '" + word + "': `edl " + command +
                                       "` takes no such word; a value holding a space must be "
                                       "quoted as one word (e.g. --checkpoint_dir '/data/ckpt "
                                       "dir')" +
                                       hint);
      }
    }
    po::store(parsed, out->vm);
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
  } catch (const po::unknown_option& e) {
    return Status::InvalidArgument(std::string(e.what()) + Suggest(all, e.get_option_name()) +
                                   hint);
  } catch (const po::error& e) {
    return Status::InvalidArgument(std::string(e.what()) + hint);
  }
  return Status::OK();
}

StatusOr<std::vector<std::string>> SplitCommandLine(const std::string& line,
                                                    const std::string& what) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  char quote = 0;  // ' or " while inside one
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote == '\'') {
      if (c == '\'')
        quote = 0;
      else
        cur += c;
    } else if (quote == '"') {
      if (c == '"') {
        quote = 0;
      } else if (c == '\\' && i + 1 < line.size() &&
                 std::string("\"\\$`").find(line[i + 1]) != std::string::npos) {
        cur += line[++i];
      } else {
        cur += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\') {
      if (i + 1 == line.size()) {
        return Status::InvalidArgument(what +
                                       " ends with a backslash that escapes nothing; remove it "
                                       "or quote the word");
      }
      cur += line[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t') {
      if (in_word) out.push_back(cur);
      cur.clear();
      in_word = false;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (quote != 0) {
    return Status::InvalidArgument(what + " has an unterminated " +
                                   (quote == '"' ? "double" : "single") + " quote; close it (" +
                                   std::string(1, quote) + "..." + std::string(1, quote) + ")");
  }
  if (in_word) out.push_back(cur);
  return out;
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
