#include "formats/hellaswag_file.h"

#include "core/error.h"
#include "formats/mapped_file.h"

namespace sq {

std::vector<HellaswagTask> parse_hellaswag_tasks(std::string_view text, const std::string& source) {
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    pos = end + 1;
  }
  if (lines.empty()) throw InputError(source + ": no HellaSwag task (the file is empty)");
  const auto where = [&](size_t i) { return source + ":" + std::to_string(i + 1) + ": "; };
  if (lines.size() % 6 != 0) {
    const size_t first = lines.size() / 6 * 6, have = lines.size() - first;
    static const char* const kMissing[6] = {"", "the gold label and the 4 endings are missing",
                                            "the 4 endings are missing", "endings 1-3 are missing",
                                            "endings 2-3 are missing", "ending 3 is missing"};
    throw InputError(where(first) + "task " + std::to_string(first / 6) + " is incomplete: the file ends after " +
                     std::to_string(have) + " of its 6 lines (context, gold label, 4 endings); " + kMissing[have]);
  }
  std::vector<HellaswagTask> tasks(lines.size() / 6);
  for (size_t t = 0; t < tasks.size(); ++t) {
    const size_t l0 = 6 * t;
    HellaswagTask& task = tasks[t];
    task.index = static_cast<int64_t>(t);
    task.line = static_cast<int64_t>(l0 + 1);
    const std::string name = "task " + std::to_string(t) + ": ";
    if (lines[l0].empty()) throw InputError(where(l0) + name + "the context is empty");
    task.context = std::string(lines[l0]);
    const std::string_view label = lines[l0 + 1];
    if (label.size() != 1 || label[0] < '0' || label[0] > '3')
      throw InputError(where(l0 + 1) + name + "the gold label must be 0, 1, 2 or 3, got '" + std::string(label) + "'");
    task.gold = label[0] - '0';
    for (size_t e = 0; e < 4; ++e) {
      const std::string_view ending = lines[l0 + 2 + e];
      if (ending.empty()) throw InputError(where(l0 + 2 + e) + name + "ending " + std::to_string(e) + " is empty");
      task.endings[e] = std::string(ending);
    }
  }
  return tasks;
}

std::vector<HellaswagTask> read_hellaswag_tasks(const std::string& path) {
  return parse_hellaswag_tasks(read_file_to_string(path), path);
}

}  // namespace sq
