// Which ranks are still alive, for the error a survivor prints when a collective fails. When a
// rank is killed, the others only learn that a socket closed ("Connection closed by peer
// [127.0.0.1]:41235"), which names no rank. Every rank therefore bumps a counter in the
// rendezvous store once a period, on a thread of its own and over a store client of its own
// (so a main thread blocked in the store does not look dead); a survivor that sees a peer
// failure reads every counter, waits a few periods and reads again: the ranks whose counter did
// not move are the ones that died or stopped (SIGKILL, a crash, SIGSTOP, a frozen node).
//
// A stopped or frozen rank closes no socket, so its peers' collectives would wait for
// parallel.timeout_s (600 s by default). The heartbeat thread therefore also watches the next
// rank's counter (rank + 1 mod W: each rank is watched once, one store read per period): when it
// has not moved for `silent_periods` periods and that rank did not stop its heartbeat on a normal
// exit, on_silent is called with the message (the runtime reports it and ends the process);
// the ranks that were waiting on this one then fail at once and name the silent rank too.
// parallel.timeout_s stays the outer bound.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mmtrain {

class PeerWatch {
 public:
  using SilentPeerHandler = std::function<void(const std::string& message)>;
  // on_silent null: no watching (only the heartbeat and silent_ranks).
  PeerWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
            std::chrono::milliseconds period = std::chrono::seconds(1), SilentPeerHandler on_silent = nullptr,
            int silent_periods = 10);
  // Stops this rank's heartbeat. A beat stuck in the store (its host SIGSTOPped or its node
  // frozen: the client then waits for the store timeout, up to parallel.timeout_s) is waited for
  // at most one period and then left to the thread, so a rank's exit never hangs on it.
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // The other ranks whose heartbeat did not advance over `window` (which should span several
  // periods), in rank order. Throws when the store cannot be read.
  std::vector<int> silent_ranks(std::chrono::milliseconds window) const;
  // silent_ranks over 3 periods, as a sentence for an error message: "rank 3 stopped answering
  // ...", "every other rank still answers ...", or why the store could not tell.
  std::string describe_silent_ranks() const;

 private:
  // The store and the period, shared with the heartbeat thread: a thread left stuck in the store
  // after the destructor returned still owns them.
  struct Beat {
    c10::intrusive_ptr<c10d::Store> store;
    std::string key, done_key;               // this rank's counter, and its normal-exit mark
    std::string watched_key, watched_done_key;  // the next rank's (empty: nothing watched)
    int watched_rank = -1;
    int silent_periods = 0;
    SilentPeerHandler on_silent;
    std::chrono::milliseconds period;
    std::mutex mutex;
    std::condition_variable wake;
    bool stopping = false;
    bool finished = false;
  };
  static void beat(const std::shared_ptr<Beat>& state);
  // Reads the watched rank's counter; true when it has been silent for silent_periods reads.
  static bool watched_rank_is_silent(Beat& state, int64_t& last, int& unchanged);
  std::string key(int rank) const;
  std::string done_key(int rank) const;

  int rank_;
  int world_size_;
  std::shared_ptr<Beat> beat_;
  std::thread thread_;
};

}  // namespace mmtrain
