#include "common/rpc/tensor_stream.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace tessera {

int TensorDTypeBytes(v1::DType t) {
  switch (t) {
    case v1::DTYPE_F32: case v1::DTYPE_I32: return 4;
    case v1::DTYPE_BF16: case v1::DTYPE_F16: return 2;
    case v1::DTYPE_I64: return 8;
    case v1::DTYPE_U8: return 1;
    default: return 0;
  }
}

v1::NamedTensor F32Tensor(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values) {
  v1::NamedTensor t;
  t.set_name(name);
  t.set_dtype(v1::DTYPE_F32);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return t;
}

bool ForEachChunk(const v1::TensorBatch& batch, const std::function<bool(const v1::TensorChunk&)>& emit,
                  size_t chunk_bytes) {
  chunk_bytes = std::max<size_t>(chunk_bytes, 1);
  v1::TensorChunk c;
  for (const v1::NamedTensor& t : batch.tensors()) {
    const std::string& d = t.data();
    size_t at = 0;
    do {
      c.Clear();
      if (at == 0) {
        c.set_name(t.name());
        c.set_dtype(t.dtype());
        *c.mutable_shape() = t.shape();
      }
      const size_t n = std::min(chunk_bytes, d.size() - at);
      c.set_data(d.substr(at, n));
      at += n;
      if (!emit(c)) return false;
    } while (at < d.size());
  }
  return true;
}

absl::Status BatchAssembler::CheckLast(bool complete) const {
  if (batch_.tensors_size() == 0) return absl::OkStatus();
  const v1::NamedTensor& t = batch_.tensors(batch_.tensors_size() - 1);
  const int64_t have = static_cast<int64_t>(t.data().size());
  if (have > expect_ || (complete && have != expect_))
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "': ", have, " bytes; its shape and dtype hold ",
                                                   expect_));
  return absl::OkStatus();
}

absl::Status BatchAssembler::Add(v1::TensorChunk&& c) {
  if (c.name().empty()) {
    if (batch_.tensors_size() == 0)
      return absl::InvalidArgumentError("tensor stream: the first chunk names no tensor");
    if (c.shape_size() > 0 || c.dtype() != v1::DTYPE_UNSPECIFIED)
      return absl::InvalidArgumentError("tensor stream: a continuation chunk carries a dtype or shape");
    batch_.mutable_tensors(batch_.tensors_size() - 1)->mutable_data()->append(c.data());
    return CheckLast(false);
  }
  if (absl::Status s = CheckLast(true); !s.ok()) return s;
  for (const v1::NamedTensor& t : batch_.tensors())
    if (t.name() == c.name()) return absl::InvalidArgumentError(absl::StrCat("tensor '", c.name(), "' comes twice"));
  const int es = TensorDTypeBytes(c.dtype());
  if (es == 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", c.name(), "': unsupported dtype ", c.dtype()));
  int64_t n = es;
  for (int64_t d : c.shape()) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 50) / d))
      return absl::InvalidArgumentError(absl::StrCat("tensor '", c.name(), "': bad shape"));
    n *= d;
  }
  v1::NamedTensor* t = batch_.add_tensors();
  t->set_name(std::move(*c.mutable_name()));
  t->set_dtype(c.dtype());
  *t->mutable_shape() = c.shape();
  t->set_data(std::move(*c.mutable_data()));
  expect_ = n;
  return CheckLast(false);
}

absl::StatusOr<v1::TensorBatch> BatchAssembler::Finish() && {
  if (absl::Status s = CheckLast(true); !s.ok()) return s;
  return std::move(batch_);
}

}  // namespace tessera
