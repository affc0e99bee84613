#include "dist/peer_watch.h"

#include <sstream>

namespace mmtrain {

PeerWatch::PeerWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, std::chrono::milliseconds period,
                     SilentPeerHandler on_silent, int silent_periods)
    : rank_(rank), world_size_(world_size), beat_(std::make_shared<Beat>()) {
  beat_->store = std::move(store);
  beat_->key = key(rank_);
  beat_->done_key = done_key(rank_);
  beat_->period = period;
  if (on_silent && world_size_ > 1) {
    beat_->watched_rank = (rank_ + 1) % world_size_;
    beat_->watched_key = key(beat_->watched_rank);
    beat_->watched_done_key = done_key(beat_->watched_rank);
    beat_->silent_periods = silent_periods;
    beat_->on_silent = std::move(on_silent);
  }
  thread_ = std::thread([state = beat_] { beat(state); });
}

PeerWatch::~PeerWatch() {
  std::unique_lock<std::mutex> lock(beat_->mutex);
  beat_->stopping = true;
  beat_->wake.notify_all();
  const bool finished = beat_->wake.wait_for(lock, beat_->period, [this] { return beat_->finished; });
  lock.unlock();
  if (finished) {
    thread_.join();
  } else {
    thread_.detach();  // still inside the store: it ends when the store answers or the process exits
  }
}

std::string PeerWatch::key(int rank) const { return "mmtrain_heartbeat/" + std::to_string(rank); }
std::string PeerWatch::done_key(int rank) const { return "mmtrain_heartbeat_done/" + std::to_string(rank); }

bool PeerWatch::watched_rank_is_silent(Beat& state, int64_t& last, int& unchanged) {
  // add(key, 0) reads a counter; 0 until the watched rank's first beat (it may start later).
  const int64_t now = state.store->add(state.watched_key, 0);
  unchanged = now > 0 && now == last ? unchanged + 1 : 0;
  last = now;
  if (unchanged < state.silent_periods) return false;
  // A rank that exited normally marked it before its last beat stopped.
  return state.store->add(state.watched_done_key, 0) == 0;
}

void PeerWatch::beat(const std::shared_ptr<Beat>& state) {
  std::unique_lock<std::mutex> lock(state->mutex);
  int64_t watched_last = 0;
  int watched_unchanged = 0;
  while (!state->stopping) {
    lock.unlock();
    bool silent = false;
    try {
      state->store->add(state->key, 1);
      if (state->on_silent) silent = watched_rank_is_silent(*state, watched_last, watched_unchanged);
    } catch (const std::exception&) {
      lock.lock();
      break;  // the store is gone (its host died): nobody can read a heartbeat any more
    }
    if (silent) {
      std::ostringstream message;
      message << "rank " << state->watched_rank << " has stopped answering: its heartbeat in the rendezvous store "
              << "has been silent for " << std::chrono::duration<double>(state->period * state->silent_periods).count()
              << " s (stopped, frozen, or its node lost); stopping rather than waiting parallel.timeout_s for its "
              << "collectives";
      state->on_silent(message.str());
      state->on_silent = nullptr;  // a handler that returns is told once
    }
    lock.lock();
    state->wake.wait_for(lock, state->period, [&] { return state->stopping; });
  }
  if (state->stopping) {
    lock.unlock();
    try {
      state->store->add(state->done_key, 1);  // a normal exit: the rank watching this one is not alarmed
    } catch (const std::exception&) {
    }
    lock.lock();
  }
  state->finished = true;
  state->wake.notify_all();
}

std::vector<int> PeerWatch::silent_ranks(std::chrono::milliseconds window) const {
  // add(key, 0) reads a counter (and creates it at 0 for a rank that never beat).
  auto read_all = [&] {
    std::vector<int64_t> beats(static_cast<size_t>(world_size_));
    for (int r = 0; r < world_size_; ++r) beats[static_cast<size_t>(r)] = beat_->store->add(key(r), 0);
    return beats;
  };
  const auto before = read_all();
  std::this_thread::sleep_for(window);
  const auto after = read_all();
  std::vector<int> silent;
  for (int r = 0; r < world_size_; ++r)
    if (r != rank_ && after[static_cast<size_t>(r)] == before[static_cast<size_t>(r)]) silent.push_back(r);
  return silent;
}

std::string PeerWatch::describe_silent_ranks() const {
  std::vector<int> silent;
  try {
    silent = silent_ranks(3 * beat_->period);
  } catch (const std::exception&) {
    return "the rendezvous store cannot be reached either, so its host (rank 0, or torchrun's agent) died or its "
           "node is unreachable";
  }
  if (silent.empty())
    return "every other rank still answers its heartbeat, so the failure is in the network or in a rank that is "
           "alive but failed";
  std::string names;
  for (size_t i = 0; i < silent.size(); ++i)
    names += (i == 0 ? "" : i + 1 == silent.size() ? " and " : ", ") + std::to_string(silent[i]);
  return std::string(silent.size() == 1 ? "rank " : "ranks ") + names + (silent.size() == 1 ? " has" : " have") +
         " stopped answering (its heartbeat in the rendezvous store stopped: killed, crashed, stopped, or its "
         "node lost)";
}

}  // namespace mmtrain
