// Tensor: dtype, shape, strides and a device, over reference-counted storage from
// an allocator. Views (Slice along a dim, for sharding) share the storage.
//
// Threading: a Tensor is a value; concurrent use of one storage is the caller's
// to order (on CUDA, through streams).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace tessera::runtime {

enum class DeviceKind { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  static Device Cpu() { return {}; }
  static Device Cuda(int i) { return {DeviceKind::kCuda, i}; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  std::string ToString() const;
};

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;
};

// Thread-safe byte accounting shared by the allocators.
class MemoryAccount {
 public:
  void Add(int64_t bytes);
  void Sub(int64_t bytes);
  MemoryStats stats() const;
  void ResetPeak();  // the peak restarts from the current bytes

 private:
  mutable std::mutex mu_;
  MemoryStats s_;
};

// Allocates device (or host) memory. CUDA allocators are stream-ordered.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* p, size_t bytes) = 0;
  virtual Device device() const = 0;
  virtual MemoryStats stats() const = 0;
  // Peaks are since the allocator's creation or this call (the CPU allocator is shared by
  // every CPU backend of the process).
  virtual void ResetPeak() = 0;
};

// 64-byte aligned host memory, with accounting.
Allocator* CpuAllocator();

class Storage {
 public:
  Storage(void* data, size_t bytes, Allocator* alloc) : data_(data), bytes_(bytes), alloc_(alloc) {}
  ~Storage() {
    if (alloc_ && data_) alloc_->Free(data_, bytes_);
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return alloc_ ? alloc_->device() : Device::Cpu(); }
  // Offload (worker/runtime/offload.h): Detach gives the memory back to its allocator —
  // data() is null until Reattach allocates the same size again (anywhere: every view
  // reads its storage's data() when used, so views and aliases follow). Only for an
  // allocator's storage; the caller keeps the bytes and orders the frees with the work.
  void Detach();
  absl::Status Reattach();
  bool detached() const { return data_ == nullptr && bytes_ > 0; }

 private:
  void* data_;
  size_t bytes_;
  Allocator* alloc_;
};

class Tensor {
 public:
  Tensor() = default;
  static absl::StatusOr<Tensor> Empty(std::vector<int64_t> shape, DType dtype, Allocator* alloc);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }  // in elements
  int64_t dim(int i) const { return shape_[i < 0 ? i + shape_.size() : i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return numel() * DTypeSize(dtype_); }
  Device device() const { return storage_ ? storage_->device() : Device::Cpu(); }
  bool defined() const { return storage_ != nullptr; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // The whole of a storage as bytes: u8 [bytes] (to copy or offload it).
  static Tensor Bytes(std::shared_ptr<Storage> storage);
  bool contiguous() const;
  void* data() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data()); }

  // A view of [start, start+len) along `dim` (INVALID_ARGUMENT naming the numbers).
  absl::StatusOr<Tensor> Slice(int dim, int64_t start, int64_t len) const;
  // Same storage, new shape (contiguous tensors only; numel must match).
  absl::StatusOr<Tensor> Reshape(std::vector<int64_t> shape) const;
  // A contiguous view of `shape` in `dtype` at byte `offset` of this contiguous tensor's
  // bytes (several buffers in one allocation, moved by one copy); the offset a multiple of
  // the dtype's size and the view inside this tensor, else INVALID_ARGUMENT.
  absl::StatusOr<Tensor> View(DType dtype, std::vector<int64_t> shape, size_t offset) const;
  std::string ShapeString() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_, strides_;
};

std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace tessera::runtime
