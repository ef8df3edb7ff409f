#include "tools/sched_sim/csv.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>

namespace edl::schedsim {

namespace {

std::vector<std::string> SplitFields(const std::string& line) {
  std::vector<std::string> out(1);
  for (char c : line) {
    if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  for (std::string& f : out) {  // surrounding blanks are not part of a field
    const size_t a = f.find_first_not_of(" \t");
    const size_t b = f.find_last_not_of(" \t");
    f = a == std::string::npos ? std::string() : f.substr(a, b - a + 1);
  }
  return out;
}

}  // namespace

int CsvTable::Column(const std::string& name) const {
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == name) return static_cast<int>(i);
  }
  return -1;
}

std::string CsvTable::Where(size_t row) const {
  return path + ":" + std::to_string(row < lines.size() ? lines[row] : 0);
}

const std::string& CsvTable::Field(size_t row, const std::string& column) const {
  return rows[row][Column(column)];
}

Status CsvTable::Double(size_t row, const std::string& column, double* out) const {
  const std::string& s = Field(row, column);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v)) {
    return Status::InvalidArgument(Where(row) + ": column '" + column + "' holds '" + s +
                                   "', not a number: write a plain decimal number there");
  }
  *out = v;
  return Status::OK();
}

Status CsvTable::Int(size_t row, const std::string& column, int64_t* out) const {
  double v = 0;
  EDL_RETURN_IF_ERROR(Double(row, column, &v));
  if (v != std::floor(v) || std::abs(v) > 9e15) {
    return Status::InvalidArgument(Where(row) + ": column '" + column + "' holds '" +
                                   Field(row, column) + "', not a whole number");
  }
  *out = static_cast<int64_t>(v);
  return Status::OK();
}

Status ReadCsv(const std::string& path, const std::vector<std::string>& required, CsvTable* out) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open it (is the data folder complete?)");
  *out = CsvTable();
  out->path = path;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::vector<std::string> fields = SplitFields(line);
    if (out->header.empty()) {
      out->header = std::move(fields);
      continue;
    }
    if (fields.size() != out->header.size()) {
      return Status::InvalidArgument(
          path + ":" + std::to_string(number) + ": " + std::to_string(fields.size()) +
          " fields where the header has " + std::to_string(out->header.size()) +
          ": give every row one value per column");
    }
    out->rows.push_back(std::move(fields));
    out->lines.push_back(number);
  }
  if (out->header.empty()) {
    return Status::InvalidArgument(path + ": empty; it needs a header line naming its columns");
  }
  std::string have;
  for (const std::string& h : out->header) have += (have.empty() ? "" : ",") + h;
  for (const std::string& r : required) {
    if (out->Column(r) < 0) {
      return Status::InvalidArgument(path + ":1: no column '" + r + "' (the header has " + have +
                                     "); add it: the file needs columns " + [&] {
                                       std::string all;
                                       for (const std::string& c : required) {
                                         all += (all.empty() ? "" : ",") + c;
                                       }
                                       return all;
                                     }());
    }
  }
  return Status::OK();
}

}  // namespace edl::schedsim
