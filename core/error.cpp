#include "core/error.h"

#include <filesystem>

namespace loom::detail {

void throw_check_failure(const std::string& what, const std::string& context,
                         const SourceLocation& where) {
  std::ostringstream out;
  out << std::filesystem::path(where.file_name()).filename().string() << ':' << where.line() << ": "
      << what << ": " << context;
  throw Error(out.str());
}

}  // namespace loom::detail
