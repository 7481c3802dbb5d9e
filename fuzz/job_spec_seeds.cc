// Writes the structure-aware fuzzer's seeds: every example job file (examples/*.yaml),
// parsed as `tessera local` parses it from the repository root, as a serialized JobSpec.
//   fuzz_job_spec_seeds EXAMPLES_DIR OUT_DIR
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/spec/job_paths.h"
#include "common/spec/job_spec.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_job_spec_seeds EXAMPLES_DIR OUT_DIR\n";
    return 2;
  }
  const std::filesystem::path examples = argv[1], out = argv[2];
  std::filesystem::create_directories(out);
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(examples)) {
    if (e.path().extension() != ".yaml") continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    auto spec = tessera::ParseJobSpecYaml(text.str());
    if (!spec.ok()) {
      std::cerr << e.path() << ": " << spec.status() << "\n";
      return 1;
    }
    tessera::ResolveRelativePaths(*spec, examples.parent_path().string());
    std::ofstream(out / (e.path().stem().string() + ".pb"), std::ios::binary) << spec->SerializeAsString();
    ++n;
  }
  std::cout << "wrote " << n << " seeds to " << out << "\n";
  return n > 0 ? 0 : 1;
}
