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

/// A weight or an activation is NaN or ±Inf (exit status 2, like any bad input). Thrown once at
/// load for a non-finite stored value (the message names the file, the tensor and the first bad
/// index; core/finite.h), and by the evaluation, generation and calibration drivers when finite
/// weights make the activations overflow on a given text (the message names the layer and where
/// in the text; model/nonfinite.h). Deriving from InputError: the model file (or the model on this
/// input) is what the user must change, not sqkit.
class NonFiniteError : public InputError {
 public:
  using InputError::InputError;
};

/// Writing an output failed (disk full, permission denied) (exit status 1).
class OutputError : public Error {
 public:
  using Error::Error;
};

}  // namespace sq
