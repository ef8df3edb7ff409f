// CsvTable: the comma-separated files of tools/sched_sim/data (data/pollux/README.md): a header
// line of column names, then rows of plain fields (no quoting; none of the files needs it). Every
// error names the file and line and says what to fix, so a damaged or hand-edited trace is
// refused with a message, never a crash.
//
// Thread-safety: values and pure functions.
#pragma once

#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::schedsim {

struct CsvTable {
  std::string path;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;  // each as wide as the header
  std::vector<int> lines;                      // the file line of each row, from 1

  // The column's index, or -1.
  int Column(const std::string& name) const;
  // "path:line" of row `row`.
  std::string Where(size_t row) const;
  // Parses row `row`'s field in `column` (which must have been required). InvalidArgument naming
  // the file, line and column for a field that is not a finite number (Int: a whole number).
  Status Double(size_t row, const std::string& column, double* out) const;
  Status Int(size_t row, const std::string& column, int64_t* out) const;
  const std::string& Field(size_t row, const std::string& column) const;
};

// Reads `path`. NotFound for a missing file; InvalidArgument for a missing header, a header that
// lacks one of `required` (naming the columns it has), or a row with a different number of
// fields. Blank lines are skipped; "\r\n" line ends are accepted.
Status ReadCsv(const std::string& path, const std::vector<std::string>& required, CsvTable* out);

}  // namespace edl::schedsim
