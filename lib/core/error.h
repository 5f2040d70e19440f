// Typed exceptions used across sqkit.
//
// Library code throws one of these; tools catch them in `run_tool` (lib/core/tool_main.h) and turn
// them into one line on stderr plus an exit status: 2 for usage and input errors (the user can fix
// the command line or the file), 1 for anything else.
#pragma once

#include <stdexcept>
#include <string>

namespace sq {

/// Base class of every sqkit exception. `what()` is a complete, user-facing sentence that names the
/// file / tensor / option at fault and what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A command-line option or argument has an invalid value (exit status 2).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// An input file is missing, unreadable, malformed or inconsistent (exit status 2).
class InputError : public Error {
 public:
  using Error::Error;
};

/// An input is well-formed but asks for something sqkit does not support, e.g. an unknown
/// architecture, dtype or `rope_scaling` (exit status 2).
class UnsupportedError : public InputError {
 public:
  using InputError::InputError;
};

/// Writing an output failed (disk full, permission denied) (exit status 1).
class OutputError : public Error {
 public:
  using Error::Error;
};

}  // namespace sq
