#include "strategies/sharded/nvme_swap.h"

#include <algorithm>

#include "core/error.h"
#include "core/tags.h"

namespace loom::strategies::sharded {

OptimizerSwap::OptimizerSwap(const std::string& directory, int buffer_count,
                             size_t reserve_bytes)
    : file_(directory, reserve_bytes), buffer_count_(buffer_count) {
  if (buffer_count < 1) tag::kNvme.fail("buffer_count must be at least 1, got ", buffer_count);
}

OptimizerSwap::~OptimizerSwap() {
  // The kernel may still be moving bytes of these tensors, which go before file_ does.
  for (size_t id = 0; id < groups_.size(); ++id) {
    try {
      finish_io(id);
    } catch (...) {
      // An I/O error while tearing down: the swap file goes away with the process anyway.
    }
  }
}

std::vector<Tensor> OptimizerSwap::tensors_of(const SubGroup& g) const {
  std::vector<Tensor> all{g.master};
  all.insert(all.end(), g.state.begin(), g.state.end());
  return all;
}

size_t OptimizerSwap::in_memory() const {
  return static_cast<size_t>(std::count_if(groups_.begin(), groups_.end(), [](const SubGroup& g) {
    return g.where != Where::File;
  }));
}

size_t OptimizerSwap::add(Tensor master) {
  if (!master.defined() || !master.device().is_cpu() || !master.is_contiguous() ||
      master.offset() != 0 || master.nbytes() != master.storage()->nbytes()) {
    tag::kNvme.fail("a swapped tensor must be a whole contiguous host storage, got ",
                    master.defined() ? master.str() : "an undefined tensor");
  }
  SubGroup g;
  g.master = std::move(master);
  g.offsets.push_back(file_.allocate(g.master.nbytes()));
  g.io.push_back(file_.write(g.offsets[0], g.master.storage()->data(), g.master.nbytes()));
  g.where = Where::Writing;
  groups_.push_back(std::move(g));
  const size_t id = groups_.size() - 1;
  finish_io(id);  // at setup: one at a time keeps host memory at one sub-group
  return id;
}

void OptimizerSwap::start_read(size_t id) {
  SubGroup& g = groups_[id];
  make_room();
  for (size_t k = 0; k < g.offsets.size(); ++k) {
    Tensor t = k == 0 ? g.master : g.state[k - 1];
    t.storage()->materialize();
    g.io.push_back(file_.read(g.offsets[k], t.storage()->data(), t.nbytes()));
  }
  g.where = Where::Reading;
}

void OptimizerSwap::finish_io(size_t id) {
  SubGroup& g = groups_[id];
  for (SwapFile::Ticket t : g.io)
    file_.wait(t);
  g.io.clear();
  if (g.where == Where::Writing) {
    for (Tensor& t : tensors_of(g))
      t.storage()->release();
    g.where = Where::File;
    writes_.erase(std::remove(writes_.begin(), writes_.end(), id), writes_.end());
  } else if (g.where == Where::Reading) {
    g.where = Where::Resident;
  }
}

void OptimizerSwap::make_room() {
  while (in_memory() >= static_cast<size_t>(buffer_count_) && !writes_.empty())
    finish_io(writes_.front());
}

void OptimizerSwap::begin_step() {
  for (size_t id = 0; id < groups_.size() && id + 1 < static_cast<size_t>(buffer_count_); ++id)
    start_read(id);
}

void OptimizerSwap::acquire(size_t id) {
  if (id >= groups_.size()) tag::kNvme.fail("acquire: no sub-group ", id);
  SubGroup& g = groups_[id];
  if (g.where == Where::Writing) finish_io(id);  // stepped twice in one step: read it back
  if (g.where == Where::File) start_read(id);
  finish_io(id);
  // Read ahead the next sub-group while this one is updated, if a buffer is free.
  const size_t next = id + 1;
  if (next < groups_.size() && groups_[next].where == Where::File &&
      in_memory() < static_cast<size_t>(buffer_count_))
    start_read(next);
}

void OptimizerSwap::release(size_t id, std::vector<Tensor> state) {
  SubGroup& g = groups_[id];
  if (g.where != Where::Resident) tag::kNvme.fail("release: sub-group ", id, " is not in memory");
  if (g.state.empty() && !state.empty()) {
    g.state = std::move(state);
    for (const Tensor& t : g.state) {
      if (!t.is_contiguous() || t.offset() != 0 || t.nbytes() != t.storage()->nbytes())
        tag::kNvme.fail("optimizer state ", t.str(), " is not a whole contiguous storage");
      g.offsets.push_back(file_.allocate(t.nbytes()));
    }
  } else if (state.size() != g.state.size()) {
    tag::kNvme.fail("sub-group ", id, " had ", g.state.size(), " state tensors and now has ",
                    state.size());
  } else {
    for (size_t k = 0; k < state.size(); ++k) {
      if (state[k].storage() == g.state[k].storage()) continue;
      if (state[k].nbytes() != g.state[k].nbytes() || !state[k].is_contiguous() ||
          state[k].offset() != 0)
        tag::kNvme.fail("optimizer state ", state[k].str(), " does not fit its swap slot");
      g.state[k].storage()->release();  // the replaced tensor's copy read this step
      g.state[k] = state[k];
    }
  }
  for (size_t k = 0; k < g.offsets.size(); ++k) {
    const Tensor& t = k == 0 ? g.master : g.state[k - 1];
    g.io.push_back(file_.write(g.offsets[k], t.storage()->data(), t.nbytes()));
  }
  g.where = Where::Writing;
  writes_.push_back(id);
}

void OptimizerSwap::read_all() {
  for (size_t id = 0; id < groups_.size(); ++id) {
    SubGroup& g = groups_[id];
    if (g.where == Where::Writing) finish_io(id);
    if (g.where != Where::File) continue;
    for (size_t k = 0; k < g.offsets.size(); ++k) {
      Tensor t = k == 0 ? g.master : g.state[k - 1];
      t.storage()->materialize();
      g.io.push_back(file_.read(g.offsets[k], t.storage()->data(), t.nbytes()));
    }
    g.where = Where::Reading;
  }
  for (size_t id = 0; id < groups_.size(); ++id)
    finish_io(id);
}

void OptimizerSwap::drop_all() {
  for (SubGroup& g : groups_) {
    for (Tensor& t : tensors_of(g))
      t.storage()->release();
    g.where = Where::File;
  }
}

void OptimizerSwap::rewrite_masters(const std::function<void(size_t id)>& fill) {
  for (size_t id = 0; id < groups_.size(); ++id) {
    acquire(id);
    fill(id);
    release(id, groups_[id].state);  // the same state tensors: only written back
  }
  end_step();
}

void OptimizerSwap::end_step() {
  for (size_t id = 0; id < groups_.size(); ++id) {
    if (groups_[id].where == Where::Resident || groups_[id].where == Where::Reading) {
      // Read ahead but not stepped (no gradient this step): drop the copy, the file has it.
      finish_io(id);
      for (Tensor& t : tensors_of(groups_[id]))
        t.storage()->release();
      groups_[id].where = Where::File;
    }
  }
  while (!writes_.empty())
    finish_io(writes_.front());
}

}  // namespace loom::strategies::sharded
