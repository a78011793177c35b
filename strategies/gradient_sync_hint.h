#pragma once
// The advice a strategy adds when a gradient reduction fails.

#include <string>

#include "comm/error.h"

namespace loom::strategies {

// When the peers are alive but late, or disagree on the collective, the usual cause is a
// rank that skipped backward (or ran a different number of them), so it never sent (or sent
// another) bucket. A peer that died needs no such hint.
inline std::string skipped_backward_hint(const CommError& error) {
  if (error.failure() == CommFailure::PeerDied) return "";
  return "; did every rank run backward on the same model this step?";
}

}  // namespace loom::strategies
