#include "worker/runtime/tensor.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera::runtime {

std::string Device::ToString() const { return kind == DeviceKind::kCpu ? "cpu" : absl::StrCat("cuda:", index); }

std::string ShapeString(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

void MemoryAccount::Add(int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  s_.current_bytes += bytes;
  s_.peak_bytes = std::max(s_.peak_bytes, s_.current_bytes);
  s_.allocations++;
}

void MemoryAccount::Sub(int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  s_.current_bytes -= bytes;
}

void MemoryAccount::ResetPeak() {
  std::lock_guard<std::mutex> l(mu_);
  s_.peak_bytes = s_.current_bytes;
}

MemoryStats MemoryAccount::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return s_;
}

namespace {
class HostAllocator final : public Allocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    size_t n = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, n);
    if (!p) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
    account_.Add(bytes);
    return p;
  }
  void Free(void* p, size_t bytes) override {
    std::free(p);
    account_.Sub(bytes);
  }
  Device device() const override { return Device::Cpu(); }
  MemoryStats stats() const override { return account_.stats(); }
  void ResetPeak() override { account_.ResetPeak(); }

 private:
  MemoryAccount account_;
};
}  // namespace

Allocator* CpuAllocator() {
  static HostAllocator* a = new HostAllocator();
  return a;
}

void Storage::Detach() {
  if (alloc_ == nullptr || data_ == nullptr) return;
  alloc_->Free(data_, bytes_);
  data_ = nullptr;
}

absl::Status Storage::Reattach() {
  if (alloc_ == nullptr || data_ != nullptr) return absl::OkStatus();
  auto p = alloc_->Allocate(bytes_);
  if (!p.ok()) return p.status();
  data_ = *p;
  return absl::OkStatus();
}

Tensor Tensor::Bytes(std::shared_ptr<Storage> storage) {
  Tensor t;
  t.dtype_ = DType::kU8;
  t.shape_ = {static_cast<int64_t>(storage->bytes())};
  t.strides_ = {1};
  t.storage_ = std::move(storage);
  return t;
}

absl::StatusOr<Tensor> Tensor::Empty(std::vector<int64_t> shape, DType dtype, Allocator* alloc) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension in shape ", runtime::ShapeString(shape)));
    n *= d;
  }
  auto p = alloc->Allocate(n * DTypeSize(dtype));
  if (!p.ok()) return p.status();
  Tensor t;
  t.storage_ = std::make_shared<Storage>(*p, n * DTypeSize(dtype), alloc);
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_.assign(t.shape_.size(), 1);
  for (int i = static_cast<int>(t.shape_.size()) - 2; i >= 0; --i) t.strides_[i] = t.strides_[i + 1] * t.shape_[i + 1];
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

bool Tensor::contiguous() const {
  int64_t expect = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

absl::StatusOr<Tensor> Tensor::Slice(int dim, int64_t start, int64_t len) const {
  if (dim < 0) dim += rank();
  if (dim < 0 || dim >= rank())
    return absl::InvalidArgumentError(absl::StrCat("slice: dim ", dim, " out of range for shape ", ShapeString()));
  if (start < 0 || len < 0 || start + len > shape_[dim])
    return absl::InvalidArgumentError(absl::StrCat("slice: [", start, ", ", start + len, ") out of range for dim ", dim,
                                                   " of shape ", ShapeString()));
  Tensor t = *this;
  t.offset_ += start * strides_[dim] * DTypeSize(dtype_);
  t.shape_[dim] = len;
  return t;
}

absl::StatusOr<Tensor> Tensor::Reshape(std::vector<int64_t> shape) const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n != numel())
    return absl::InvalidArgumentError(absl::StrCat("reshape: ", ShapeString(), " has ", numel(), " elements, ",
                                                   runtime::ShapeString(shape), " has ", n));
  if (!contiguous()) return absl::InvalidArgumentError(absl::StrCat("reshape: tensor ", ShapeString(), " is not contiguous"));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_.assign(t.shape_.size(), 1);
  for (int i = static_cast<int>(t.shape_.size()) - 2; i >= 0; --i) t.strides_[i] = t.strides_[i + 1] * t.shape_[i + 1];
  return t;
}

absl::StatusOr<Tensor> Tensor::View(DType dtype, std::vector<int64_t> shape, size_t offset) const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t es = DTypeSize(dtype);
  if (!contiguous()) return absl::InvalidArgumentError(absl::StrCat("view: tensor ", ShapeString(), " is not contiguous"));
  if (n < 0 || offset % es != 0 || (offset_ + offset) % es != 0 || offset + n * es > nbytes())
    return absl::InvalidArgumentError(absl::StrCat("view: ", runtime::ShapeString(shape), " ", DTypeName(dtype), " at byte ",
                                                   offset, " does not fit aligned in ", nbytes(), " bytes"));
  Tensor t = *this;
  t.offset_ += offset;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_.assign(t.shape_.size(), 1);
  for (int i = static_cast<int>(t.shape_.size()) - 2; i >= 0; --i) t.strides_[i] = t.strides_[i + 1] * t.shape_[i + 1];
  return t;
}

std::string Tensor::ShapeString() const { return runtime::ShapeString(shape_); }

}  // namespace tessera::runtime
