#include "dist/node_names.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

namespace mmtrain {
namespace {

const char* kKeyPrefix = "mmtrain/node_of_rank/";

// The distinct nodes, in order of their first rank.
std::vector<std::string> distinct(const std::vector<std::string>& node_of_rank) {
  std::vector<std::string> nodes;
  for (const auto& node : node_of_rank)
    if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
  return nodes;
}

}  // namespace

std::string node_name() {
  if (const char* name = std::getenv("MMTRAIN_NODE_NAME"); name && *name) return name;
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "unknown-host";
  return host;
}

std::vector<std::string> node_names_of_ranks(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world) {
  if (!store) return {node_name()};
  const std::string mine = node_name();
  store->set(kKeyPrefix + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> names;
  for (int r = 0; r < world; ++r) {
    const auto bytes = store->get(kKeyPrefix + std::to_string(r));  // waits for rank r's key
    names.emplace_back(bytes.begin(), bytes.end());
  }
  return names;
}

std::string describe_nodes(const std::vector<std::string>& node_of_rank) {
  std::string text;
  for (const auto& node : distinct(node_of_rank)) {
    std::vector<int> ranks;
    for (size_t r = 0; r < node_of_rank.size(); ++r)
      if (node_of_rank[r] == node) ranks.push_back(static_cast<int>(r));
    const bool contiguous = ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size());
    std::string list;
    if (ranks.size() == 1) {
      list = "rank " + std::to_string(ranks[0]);
    } else if (contiguous) {
      list = "ranks " + std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
    } else {
      for (int r : ranks) list += (list.empty() ? "ranks " : ",") + std::to_string(r);
    }
    text += (text.empty() ? "" : ", ") + node + " (" + list + ")";
  }
  return text;
}

std::vector<std::string> nodes_missing(const std::vector<std::string>& before, const std::vector<std::string>& after) {
  std::vector<std::string> missing;
  for (const auto& node : distinct(before))
    if (std::find(after.begin(), after.end(), node) == after.end()) missing.push_back(node);
  return missing;
}

}  // namespace mmtrain
