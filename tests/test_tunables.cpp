// core/tunables.h is the one list of LOOM_* variables: README's table must show exactly its
// declarations, in its order, and all_tunables() must list every declaration. (That no code
// names a variable by a literal of its own is tests/docs/tunables_documented.sh's check.)

#include "core/tunables.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef LOOM_SOURCE_DIR
#error "LOOM_SOURCE_DIR must name the source tree (set in tests/CMakeLists.txt)"
#endif

namespace loom {
namespace {

std::string read_source(const std::string& relative) {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/" + relative);
  EXPECT_TRUE(in.good()) << "cannot read " << relative;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The rows of README's table of environment variables: the lines after its header and
// separator, up to the first line that is not a table row.
std::vector<std::string> readme_rows() {
  std::istringstream readme(read_source("README.md"));
  std::vector<std::string> rows;
  std::string line;
  while (std::getline(readme, line) && line != "| variable | default | meaning |") {
  }
  if (!std::getline(readme, line)) return rows;  // the separator, |---|---|---|
  while (std::getline(readme, line) && line.starts_with("|"))
    rows.push_back(line);
  return rows;
}

std::string row_of(const Tunable& t) {
  return "| `" + std::string(t.name) + "` | " + std::string(t.default_text) + " | " +
         std::string(t.doc) + " |";
}

TEST(Tunables, ReadmeTableIsTheDeclarations) {
  const std::vector<std::string> rows = readme_rows();
  ASSERT_FALSE(rows.empty()) << "README.md has no '| variable | default | meaning |' table";
  std::vector<std::string> expected;
  for (const Tunable& t : all_tunables())
    expected.push_back(row_of(t));
  for (size_t i = 0; i < std::max(rows.size(), expected.size()); ++i) {
    EXPECT_EQ(i < rows.size() ? rows[i] : "(no row)", i < expected.size() ? expected[i] : "(none)")
        << "README.md's table, row " << i + 1 << " (left) vs core/tunables.h (right)";
  }
}

TEST(Tunables, EveryDeclarationIsListed) {
  const std::string header = read_source("core/tunables.h");
  const std::regex declaration(R"re(inline constexpr Tunable k\w+\{\s*"(LOOM_[A-Z0-9_]+)")re");
  std::vector<std::string> declared;
  for (std::sregex_iterator it(header.begin(), header.end(), declaration), end; it != end; ++it)
    declared.push_back((*it)[1]);
  std::vector<std::string> listed;
  for (const Tunable& t : all_tunables())
    listed.push_back(t.name);
  EXPECT_FALSE(declared.empty());
  EXPECT_EQ(declared, listed) << "core/tunables.h's declarations vs all_tunables(), in order";
}

TEST(Tunables, EachIsOneWellFormedRow) {
  std::set<std::string> names;
  for (const Tunable& t : all_tunables()) {
    EXPECT_TRUE(names.insert(t.name).second) << t.name << " is declared twice";
    EXPECT_TRUE(std::regex_match(t.name, std::regex("LOOM_[A-Z0-9_]+"))) << t.name;
    EXPECT_FALSE(t.default_text.empty()) << t.name;
    EXPECT_FALSE(t.doc.empty()) << t.name;
    for (std::string_view text : {t.default_text, t.doc}) {
      EXPECT_EQ(text.find_first_of("|\n"), std::string_view::npos)
          << t.name << ": '" << text << "' would break README's table";
    }
  }
}

TEST(Tunables, ValueIsTheEnvironmentsOrNull) {
  const Tunable& t = tunables::kPerfCommand;
  ASSERT_EQ(::setenv(t.name, "loom-perf --np 2", 1), 0);
  ASSERT_NE(tunable_value(t), nullptr);
  EXPECT_STREQ(tunable_value(t), "loom-perf --np 2");
  ASSERT_EQ(::setenv(t.name, "", 1), 0);
  EXPECT_STREQ(tunable_value(t), "");
  ASSERT_EQ(::unsetenv(t.name), 0);
  EXPECT_EQ(tunable_value(t), nullptr);
}

}  // namespace
}  // namespace loom
