#pragma once
// A POSIX shared-memory segment mapped into this process. The creator picks an unguessable
// name (/loom-<128 random bits>) and creates it with O_EXCL and mode 0600; the others open
// it by name. unlink() removes the name (the mapping stays valid): the shm backend calls it
// as soon as every rank has attached, so nothing is left in /dev/shm even after SIGKILL.
// A rank killed before that (while it waits for the others to attach) cannot unlink: so
// launchers tag their job (LOOM_JOB_ID, tunables::kJobId, set in every rank's environment),
// segments of a tagged job are named /loom-<job id>-<128 random bits>, and the launcher
// removes the job's segments once all its ranks have exited (remove_job_segments).

#include <cstddef>
#include <string>

namespace loom::comm::shm {

// A fresh job id for a launcher: 16 random hex digits.
std::string new_job_id();
// Unlinks every /dev/shm segment of the job; returns how many there were.
int remove_job_segments(const std::string& job_id);

class Segment {
 public:
  static Segment create(size_t bytes);                         // zero-filled
  static Segment open(const std::string& name, size_t bytes);  // checks the size
  Segment() = default;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  ~Segment();  // unmaps; unlinks too if this process created it and has not unlinked yet

  void unlink() noexcept;
  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;
};

}  // namespace loom::comm::shm
