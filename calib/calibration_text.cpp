#include "calib/calibration_text.h"

#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "formats/fingerprint.h"

namespace sq {

namespace fs = std::filesystem;

namespace {

/// First 12 hex digits and an ellipsis, as the fingerprint messages print hashes.
std::string short_hash(const std::string& h) { return h.size() > 12 ? h.substr(0, 12) + "…" : (h.empty() ? "(empty)" : h); }

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);  // follows symbolic links
}

}  // namespace

std::string canonical_text_path(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::canonical(path, ec);
  if (!ec) return p.string();
  p = fs::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

ResolvedCalibrationText resolve_calibration_text(const CalibrationProvenance& pv, const std::string& calib_path,
                                                 const std::string& explicit_text, const std::string& purpose,
                                                 const std::string& alternative) {
  const std::string hint = "give it with --calib-text FILE" + (alternative.empty() ? "" : " " + alternative);
  std::string found;
  if (!explicit_text.empty()) {
    if (!is_file(explicit_text)) throw InputError("--calib-text " + explicit_text + ": no such file");
    found = explicit_text;
  } else if (pv.text_path.empty()) {
    throw InputError(calib_path + " records no calibration text path; " + purpose + " re-reads that text: " + hint);
  } else if (fs::path(pv.text_path).is_absolute()) {
    if (!is_file(pv.text_path))
      throw InputError(calib_path + ": its calibration text " + pv.text_path + " is not found; " + purpose + " re-reads it: " + hint);
    found = pv.text_path;
  } else {
    // A relative path (calibration files written before sq-calibrate recorded absolute paths): next
    // to the calibration file first, then in the working directory.
    const fs::path beside = fs::path(calib_path).parent_path() / pv.text_path;
    if (is_file(beside)) {
      found = beside.string();
    } else if (is_file(pv.text_path)) {
      found = pv.text_path;
    } else {
      std::error_code ec;
      const fs::path cwd = fs::current_path(ec);
      throw InputError(calib_path + ": its calibration text " + pv.text_path + " (a relative path) is not found beside it (" +
                       canonical_text_path(beside.string()) + ") nor in the working directory (" +
                       (ec ? pv.text_path : (cwd / pv.text_path).lexically_normal().string()) + "); " + purpose +
                       " re-reads it: " + hint);
    }
  }
  const std::string sha = sha256_file_hex(found);  // InputError when unreadable
  if (sha != pv.text_sha256)
    throw InputError(found + ": SHA-256 " + short_hash(sha) + " differs from the text_sha256 " + short_hash(pv.text_sha256) +
                     " that " + calib_path + " records for its calibration text; " + purpose + " needs the text it was calibrated on" +
                     (explicit_text.empty() ? " (a different file under the recorded name? give the original with --calib-text FILE)" : ""));
  return {canonical_text_path(found), sha};
}

}  // namespace sq
