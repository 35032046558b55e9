// Plain-text output helpers: aligned tables, thousands separators, byte sizes.
#ifndef SOAP_SUPPORT_FORMAT_H
#define SOAP_SUPPORT_FORMAT_H

#include "llvm/Support/raw_ostream.h"
#include <cstdint>
#include <string>
#include <vector>

namespace soap {

/// A table printed with columns padded to their widest cell. Columns whose
/// header is right-aligned (numbers) are marked with `rightAlign`.
class Table {
public:
  explicit Table(std::vector<std::string> header,
                 std::vector<bool> rightAlign = {});
  void addRow(std::vector<std::string> row);
  void print(llvm::raw_ostream &os) const;
  /// RFC 4180 CSV of the same cells.
  void printCsv(llvm::raw_ostream &os) const;

private:
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

/// A table whose rows are printed as they come (compare streams its rows):
/// column widths are fixed up front; a longer cell widens its own row only.
/// CSV when `csv`, with the same cells.
class StreamingTable {
public:
  struct Column {
    std::string header;
    size_t width;
    bool right = false;
  };
  StreamingTable(llvm::raw_ostream &os, std::vector<Column> cols, bool csv);
  /// The header (and, for text, a rule under it).
  void header();
  /// One row, flushed.
  void row(std::vector<std::string> cells);

private:
  llvm::raw_ostream &os_;
  std::vector<Column> cols_;
  bool csv_;
};

/// RFC 4180: quoted when it holds a comma, quote or newline.
std::string csvCell(const std::string &s);

/// 44549160 -> "44,549,160".
std::string withCommas(int64_t n);
/// 1536 -> "1.50 KiB"; exact bytes below 1 KiB.
std::string formatBytes(double bytes);
/// 3.2e9 -> "3.20 G" (SI prefixes for FLOPs and counts).
std::string formatSi(double value);

} // namespace soap

#endif // SOAP_SUPPORT_FORMAT_H
