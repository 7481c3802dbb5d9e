#include "kernels/gemm/cublaslt_loader.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace tessera::kernels {
namespace {
absl::StatusOr<CublasLt> Load() {
  void* lib = nullptr;
  std::string errors;
  for (const char* name : {"libcublasLt.so.13", "libcublasLt.so", "/usr/local/cuda/lib64/libcublasLt.so.13"}) {
    if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", dlerror());
  }
  if (lib == nullptr) return absl::UnavailableError(absl::StrCat("cannot load cuBLASLt: ", errors));
  CublasLt lt;
  std::string missing;
  auto get = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", symbol);
  };
  get(lt.Create, "cublasLtCreate");
  get(lt.Destroy, "cublasLtDestroy");
  get(lt.MatmulDescCreate, "cublasLtMatmulDescCreate");
  get(lt.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  get(lt.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  get(lt.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  get(lt.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  get(lt.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  get(lt.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  get(lt.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  get(lt.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  get(lt.Matmul, "cublasLtMatmul");
  if (!missing.empty()) return absl::UnavailableError(absl::StrCat("cuBLASLt lacks ", missing));
  return lt;
}
}  // namespace

absl::StatusOr<const CublasLt*> GetCublasLt() {
  static const absl::StatusOr<CublasLt> loaded = Load();  // thread-safe static init
  if (!loaded.ok()) return loaded.status();
  return &*loaded;
}

}  // namespace tessera::kernels
