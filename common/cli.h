// Command-line parsing shared by strata's tools (header-only: only the
// tools, which link CLI11, include it).
//
//   CLI::App app("strata-x: ...");
//   ... app.add_option(...) ...
//   bool exit_now = false;
//   if (Status st = ParseArgs(app, argc, argv, &exit_now); !st.ok()) ...
//   if (exit_now) return;  // --help was printed
#ifndef STRATA_COMMON_CLI_H_
#define STRATA_COMMON_CLI_H_

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

// Parses argv into `app`. On --help prints the help, sets *exit_now and
// returns OK; a bad command line is kInvalidArgument with CLI11's message
// and a pointer to --help.
inline Status ParseArgs(CLI::App& app, int argc, char** argv, bool* exit_now) {
  *exit_now = false;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    *exit_now = true;
    app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(e.what() +
                                   std::string("; run with --help for usage"));
  }
  return Status::Ok();
}

// The parsed value, or its error with the flag that gave the text in front:
//   STRATA_ASSIGN_OR_RETURN(o.bs, ForFlag("--bs", ParseSize(text)));
template <typename T>
Result<T> ForFlag(std::string_view flag, Result<T> parsed) {
  if (parsed.ok()) return parsed;
  return Status::InvalidArgument(std::string(flag) + ": " +
                                 parsed.status().message());
}

}  // namespace strata

#endif  // STRATA_COMMON_CLI_H_
