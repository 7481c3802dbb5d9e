// Relative paths in a job file, resolved against a base directory. `tessera local`
// (client/main.cc) resolves them against the directory it runs in, so that the examples'
// `examples/data/...` and `checkpoints/...` work from the repository root; a cluster's
// controller takes absolute paths only (NormalizeAndValidateJobSpec says so by field).
#pragma once
#include <string>

#include "tessera/v1/common.pb.h"

namespace tessera {

// Makes every path field that is set and relative (train.checkpoint.dir / .load,
// train.export_hf, train.data.path, model.hf_dir, a tokenizer directory,
// generate.input / .output / .checkpoint) absolute under base_dir, lexically
// normalized. Empty fields stay empty; an empty checkpoint message is cleared.
void ResolveRelativePaths(v1::JobSpec& spec, const std::string& base_dir);

}  // namespace tessera
