// One run per save root. A job started twice into the same training.save would race the first
// (the second died late on a rename while the first trained on). Rank 0 holds an exclusive
// flock(2) on <save_root>/.mmtrain.lock for the life of the run, with its host, pid and start
// time written in the file; a second run is refused up front, naming them. The kernel drops the
// lock when its holder dies, so the file of a dead run is taken over (and said so).
#pragma once
#include <string>

namespace mmtrain {

class SaveRootLock {
 public:
  // Creates save_root's lock file if needed and locks it; fails naming the holder's host and pid
  // when another process holds it. `label` is what messages call the directory ("training.save",
  // "convert --save_dir"). The lock file is opened O_NOFOLLOW: a symlink there is refused.
  explicit SaveRootLock(const std::string& save_root, const std::string& label = "training.save");
  ~SaveRootLock();
  SaveRootLock(const SaveRootLock&) = delete;
  SaveRootLock& operator=(const SaveRootLock&) = delete;

  // What the lock file said when it was taken over from a run that is gone ("host h, pid p,
  // since ..."); empty when it was new or empty.
  const std::string& previous_holder() const { return previous_holder_; }

 private:
  int fd_ = -1;
  std::string previous_holder_;
};

}  // namespace mmtrain
