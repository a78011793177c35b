#pragma once
// `loom-trace analyze DIR`: reads every rank's flight-recorder dump (comm/flight_recorder.h,
// DIR/flight.rank-R.json) and, per process group, names the first collective the ranks
// disagree on (another operation, size or dtype at the same sequence number), the first one
// some rank never issued, or the first one that completed on some ranks but not on others
// (where a job stalled). Point-to-point operations are listed, not compared.

#include <filesystem>
#include <string>

namespace loom::trace {

struct Analysis {
  std::string report;  // human-readable, one paragraph per group
  bool found = false;  // a disagreement, a missing operation or a stall was found
};

// Throws loom::Error when DIR holds no dump or a dump is unreadable.
Analysis analyze_flight_dumps(const std::filesystem::path& dir);

}  // namespace loom::trace
