// Where the calibration text is: recorded robustly by sq-calibrate, found and verified again by
// sq-convert (--alpha auto, sequential GPTQ Hessians and Atom --clip search re-draw the calibration
// windows from it).
//
// Rule (docs/formats.md, "Finding the calibration text again"):
//  1. `--calib-text FILE` when given (a path as usual on the command line: relative to the working
//     directory);
//  2. else the calibration file's `text_path`: sq-calibrate records the absolute, canonical path, used
//     as it is; a relative `text_path` (files written before sqkit recorded absolute paths) is looked
//     up relative to the calibration file's directory, then relative to the working directory — the
//     first that exists is taken.
//  3. The file found is always hashed and must match the recorded `text_sha256`, so whatever the
//     working directory, either the same bytes are read or the conversion is refused.
#pragma once

#include <string>

#include "calib/activation_stats.h"

namespace sq {

/// The absolute, canonical form of `path` (symbolic links, `.` and `..` resolved) for recording in a
/// calibration file; the absolute, lexically normalized path when it cannot be canonicalized (e.g. it
/// does not exist). Throws nothing but std::bad_alloc.
std::string canonical_text_path(const std::string& path);

/// The calibration text a conversion re-reads, found and verified.
struct ResolvedCalibrationText {
  std::string path;    ///< the file read (absolute, canonical): what the .sqm records
  std::string sha256;  ///< its SHA-256, equal to the calibration file's text_sha256
};

/// Finds the calibration text of the calibration file `calib_path` (provenance `pv`, read from it)
/// by the rule at the top of this header, `explicit_text` being `--calib-text` ("" when not given),
/// and checks its SHA-256 against pv.text_sha256. `purpose` names what needs the text (e.g.
/// "--alpha auto") and `alternative` is "" or a hint appended to the not-found message (e.g. "or
/// use ... --gptq-hessians file"). Throws InputError, one sentence each:
///  * "--calib-text FILE: no such file" when `explicit_text` is not an existing file;
///  * "CALIB: its calibration text PATH is not found; PURPOSE re-reads it: give it with --calib-text
///    FILE[ ALTERNATIVE]" for a recorded absolute path; for a relative one "CALIB: its calibration
///    text PATH (a relative path) is not found beside it (DIR/PATH) nor in the working directory
///    (CWD/PATH); PURPOSE re-reads it: ..."; "CALIB records no calibration text path; ..." for an
///    empty record;
///  * "TEXT: SHA-256 abc… differs from the text_sha256 def… that CALIB records for its calibration
///    text; PURPOSE needs the text it was calibrated on[ (a different file under the recorded name?
///    give the original with --calib-text FILE)]" when the file found has other bytes (TEXT as given
///    or as found, hashes shortened to 12 hex digits);
/// and InputError from reading the text (sha256_file_hex).
ResolvedCalibrationText resolve_calibration_text(const CalibrationProvenance& pv, const std::string& calib_path,
                                                 const std::string& explicit_text, const std::string& purpose,
                                                 const std::string& alternative = "");

}  // namespace sq
