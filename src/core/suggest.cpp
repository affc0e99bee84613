// Edit distance and closest-name lookup for did-you-mean messages (contract in suggest.h).
#include "core/suggest.h"

#include <algorithm>

namespace mmtrain {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  const std::size_t n = a.size(), m = b.size();
  // Three rows are enough: the swap rule looks back two rows.
  std::vector<std::size_t> before(m + 1), previous(m + 1), current(m + 1);
  for (std::size_t j = 0; j <= m; ++j) previous[j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        current[j] = std::min(current[j], before[j - 2] + 1);
    }
    std::swap(before, previous);
    std::swap(previous, current);
  }
  return previous[m];
}

std::string closest_name(const std::string& typed, const std::vector<std::string>& candidates) {
  const std::size_t limit = std::max<std::size_t>(2, typed.size() / 3);
  std::string best;
  std::size_t best_distance = limit + 1;
  for (const auto& candidate : candidates) {
    const std::size_t distance = edit_distance(typed, candidate);
    if (distance < best_distance && distance < typed.size()) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string join_names(const std::vector<std::string>& names, const std::string& separator) {
  std::string joined;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) joined += separator;
    joined += names[i];
  }
  return joined;
}

}  // namespace mmtrain
