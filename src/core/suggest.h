// Did-you-mean for names a person typed (config keys, registry names): the closest candidate by
// edit distance, offered only when it is close enough to be a plausible typo. Pure string code,
// no dependencies, so every error path can use it.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace mmtrain {

// Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of two
// adjacent characters each cost 1 (a swap is the most common typo: "dtpye").
std::size_t edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to typed, or "" when none is within max(2, typed.size() / 3) edits (and
// strictly fewer edits than typed has characters). Ties go to the earlier candidate.
std::string closest_name(const std::string& typed, const std::vector<std::string>& candidates);

// "a, b, c": for "known names: ..." lists in messages.
std::string join_names(const std::vector<std::string>& names, const std::string& separator = ", ");

}  // namespace mmtrain
