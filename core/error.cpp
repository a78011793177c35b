#include "core/error.h"

#include <filesystem>
#include <system_error>

namespace loom::detail {

void throw_check_failure(const std::string& what, const std::string& context,
                         const SourceLocation& where) {
  std::ostringstream out;
  out << std::filesystem::path(where.file_name()).filename().string() << ':' << where.line() << ": "
      << what << ": " << context;
  throw Error(out.str());
}

}  // namespace loom::detail

namespace loom {

std::string errno_text(int error) {
  return std::system_category().message(error);
}

}  // namespace loom
