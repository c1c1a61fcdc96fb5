// libFuzzer target for MaxText model files: the input is a model file read over MaxText's real
// base.yml, then the parameter tree is built, placed on a small mesh (MaxText's kv-head check
// first) and planned, and the TrainState dump entries are formed, so whatever the reader accepts
// runs through the whole abstract path. tessel::Error is the expected outcome of bad input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessel/core/error.h"
#include "tessel/detail/file_util.h"
#include "tessel/models/maxtext.h"
#include "tessel/models/maxtext_checkpoint.h"
#include "tessel/state/init.h"
#include "tessel/state/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string base = tessel::file_util::read_text(TESSEL_MAXTEXT_BASE);
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tessel::MaxTextConfig c = tessel::parse_maxtext_config(base, text, {}, "base.yml", "fuzz.yml");
    // Unscanned layers are one Module each: keep an iteration quick.
    if (!c.scan_layers && c.num_decoder_layers > 64) return 0;
    const tessel::Mesh mesh = c.mesh(8);
    c.check_mesh(mesh);
    const tessel::State params = tessel::eval_shape(tessel::maxtext_model(c), mesh, c.rules);
    (void)tessel::plan(params, {.optimizer = tessel::Optimizer::kAdamW}).to_string();
    (void)tessel::maxtext_train_state(c, params).size();
  } catch (const tessel::Error&) {
  }
  return 0;
}
