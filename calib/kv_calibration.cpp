#include "calib/kv_calibration.h"

#include "core/error.h"

namespace sq {

KVQuantization fit_kv_quantization(const KVSpec& spec, const std::string& calib_path, const LlamaModel& model) {
  (void)model;
  if (spec.kind != KVKind::Nuq) return KVQuantization{spec, {}};
  if (calib_path.empty())
    throw UsageError("--kv " + kv_spec_name(spec) + " needs --calib: a calibration file from sq-calibrate --fisher");
  throw InputError(calib_path + ": no Fisher information (run sq-calibrate --fisher)");
}

}  // namespace sq
