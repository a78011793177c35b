// comm/cuda_support.h in a build without CUDA: no CUDA tensor can exist, so nothing is ever
// captured and nothing needs staging.

#include "comm/cuda_support.h"

#include "core/error.h"
#include "core/tags.h"

namespace loom::comm {

struct IssueStreamScope::Guard {};

IssueStream capture_issue_stream(Device) {
  return {};
}

IssueStreamScope::IssueStreamScope(const IssueStream&) {}
IssueStreamScope::~IssueStreamScope() = default;

std::unique_ptr<Backend> make_staging_backend(Backend& host) {
  tag::kComm.fail(
      "the '", host.name(),
      "' backend was given CUDA tensors, but this build has no CUDA support (configure with "
      "-DLOOM_WITH_CUDA=ON)");
}

}  // namespace loom::comm
