// TaskQueue: one background thread running posted functions in FIFO order.
// Thread-safe. Close() (and the destructor) runs what is queued, then joins; an owner whose tasks
// refer to the owner closes the queue before tearing anything down.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace viper::internal {

class TaskQueue {
 public:
  explicit TaskQueue(std::string name) : name_(std::move(name)), thread_([this] { Run(); }) {}
  ~TaskQueue() { Close(); }
  // Runs what is queued, then stops the thread. Idempotent; tasks posted afterwards never run.
  // REQUIRES: not called from a task; one thread closes.
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  void Post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  size_t pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tasks_.size() + (busy_ ? 1 : 0);
  }
  // Waits until the queue is empty and no task runs; false on timeout.
  bool Drain(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return idle_cv_.wait_for(lock, timeout, [this] { return tasks_.empty() && !busy_; });
  }
  // Waits until fewer than `limit` tasks are queued or running.
  void WaitBelow(size_t limit) {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return tasks_.size() + (busy_ ? 1 : 0) < limit; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
      lock.unlock();
      task();
      task = nullptr;  // destroy captures outside the lock too
      lock.lock();
      busy_ = false;
      idle_cv_.notify_all();
    }
  }

  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the state above exists
};

}  // namespace viper::internal
