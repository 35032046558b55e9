// Plain-text tables and number formatting for the tools' human output.
#include "soap/Support/Format.h"

#include <fmt/format.h>

namespace soap {

Table::Table(std::vector<std::string> header, std::vector<bool> rightAlign)
    : header_(std::move(header)), right_(std::move(rightAlign)) {
  right_.resize(header_.size(), false);
}

void Table::addRow(std::vector<std::string> row) {
  row.resize(header_.size());
  rows_.push_back(std::move(row));
}

void Table::print(llvm::raw_ostream &os) const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    width[c] = header_[c].size();
    for (const auto &r : rows_)
      width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string> &cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      std::string pad(width[c] - cells[c].size(), ' ');
      if (c)
        out += "  ";
      out += right_[c] ? pad + cells[c] : cells[c] + pad;
    }
    while (!out.empty() && out.back() == ' ')
      out.pop_back();
    os << out << "\n";
  };
  line(header_);
  std::vector<std::string> rule;
  for (size_t w : width)
    rule.push_back(std::string(w, '-'));
  line(rule);
  for (const auto &r : rows_)
    line(r);
}

std::string csvCell(const std::string &s) {
  if (s.find_first_of(",\"\n") == std::string::npos)
    return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"')
      out += '"';
    out += c;
  }
  return out + "\"";
}

void Table::printCsv(llvm::raw_ostream &os) const {
  auto line = [&](const std::vector<std::string> &cells) {
    for (size_t c = 0; c < cells.size(); ++c)
      os << (c ? "," : "") << csvCell(cells[c]);
    os << "\n";
  };
  line(header_);
  for (const auto &r : rows_)
    line(r);
}

StreamingTable::StreamingTable(llvm::raw_ostream &os, std::vector<Column> cols,
                               bool csv)
    : os_(os), cols_(std::move(cols)), csv_(csv) {
  for (Column &c : cols_)
    c.width = std::max(c.width, c.header.size());
}

void StreamingTable::header() {
  std::vector<std::string> h, rule;
  for (const Column &c : cols_) {
    h.push_back(c.header);
    rule.push_back(std::string(c.width, '-'));
  }
  row(h);
  if (!csv_)
    row(rule);
}

void StreamingTable::row(std::vector<std::string> cells) {
  cells.resize(cols_.size());
  std::string out;
  for (size_t c = 0; c < cells.size(); ++c) {
    if (csv_) {
      out += (c ? "," : "") + csvCell(cells[c]);
      continue;
    }
    size_t w = cols_[c].width;
    std::string pad(w > cells[c].size() ? w - cells[c].size() : 0, ' ');
    if (c)
      out += "  ";
    out += cols_[c].right ? pad + cells[c] : cells[c] + pad;
  }
  while (!csv_ && !out.empty() && out.back() == ' ')
    out.pop_back();
  os_ << out << "\n";
  os_.flush();
}

std::string withCommas(int64_t n) {
  uint64_t mag = n < 0 ? 0 - uint64_t(n) : uint64_t(n);
  std::string digits = std::to_string(mag);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string formatBytes(double bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  if (u == 0)
    return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string formatSi(double value) {
  static const char *units[] = {"", "K", "M", "G", "T", "P", "E"};
  int u = 0;
  while (value >= 1000 && u < 6) {
    value /= 1000;
    ++u;
  }
  if (u == 0)
    return fmt::format("{:.0f}", value);
  return fmt::format("{:.2f} {}", value, units[u]);
}

} // namespace soap
