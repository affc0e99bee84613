// Which node each rank runs on, so that a run resumed on a different set of nodes (an elastic
// restart after a node was lost, or one that joined) can say which ones changed.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

namespace mmtrain {

// This process's node: $MMTRAIN_NODE_NAME when set (several torchrun agents on one host, as in
// tests), else the host name.
std::string node_name();

// Every rank's node_name(), in rank order. Collective over the store: each rank sets its own key
// and reads everyone's. A null store (one process) gives {node_name()}.
std::vector<std::string> node_names_of_ranks(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world);

// "node-a (ranks 0-1), node-b (ranks 2-3)": the nodes in order of their first rank.
std::string describe_nodes(const std::vector<std::string>& node_of_rank);

// The nodes in `before` that are not in `after`, in order of their first rank there.
std::vector<std::string> nodes_missing(const std::vector<std::string>& before, const std::vector<std::string>& after);

}  // namespace mmtrain
