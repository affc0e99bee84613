// Summaries of a list of measurements (step times, losses), for the log and ablation tools and
// the benchmarks: one definition of each, so that every report means the same by "median".
#pragma once
#include <vector>

namespace mmtrain {

// The middle value (mean of the two middle ones for an even count). v must not be empty.
double median(std::vector<double> v);
// numpy's default percentile (linear interpolation between closest ranks), q in [0, 100].
double percentile(std::vector<double> v, double q);
double mean(const std::vector<double>& v);
// The sample standard deviation (n - 1 in the denominator); 0 for fewer than two values.
double sample_sd(const std::vector<double>& v);

}  // namespace mmtrain
