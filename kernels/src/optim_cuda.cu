// The optimizer step on a CUDA device, the host side: fused multi-tensor kernels for SGD, Adam
// and AdamW with fp32, bf16 and 8-bit block-wise moments, staged and launched from here
// (cuda_ops.hpp's all_finite, sums_of_squares, optimizer_step, checked_step). The kernels are in
// optim_cuda_step.cu, optim_cuda_8bit.cu and optim_cuda_checks.cu (optim_cuda.cuh lists them),
// one element's update and its reference in optim_cuda_update.cuh.
//
// A step is up to three launches after the non-finite check (checked_step queues them behind it,
// and they skip themselves when it fails):
// - elementwise_step: tensors without 8-bit moments, in work items of 2048 elements;
// - blockwise_step: tensors with 8-bit moments, a group of threads per quantization block, for
//   the tensors in the plain 8-bit layout and for the others.
// Both read a device array of tensor descriptors and, per tensor, the index of its first work
// item (a prefix sum), so a whole list of tensors is one launch and what goes to the device per
// step is O(tensors), not O(blocks); each thread block (or warp) steps a contiguous share of the
// items, finding the first one's tensor by binary search and stepping forward from there.

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "troupe/core/tensor.hpp"

#include "cuda_ops.hpp"
#include "optim_cuda.cuh"

namespace troupe::kernels::cuda {
namespace {

/// A page-locked host buffer: a copy from (or to) it is asynchronous, where one from pageable
/// memory waits for the device.
struct pinned_buffer {
  std::byte* host = nullptr;
  std::size_t capacity = 0;
  cudaEvent_t done = nullptr;  ///< recorded behind the last copy that uses the buffer
};

/// A device's page-locked buffers, handed out again only once the copy recorded behind them has
/// completed. They live as long as the process (a few, of a few KiB each).
class pinned_pool {
public:
  explicit pinned_pool(int device) : device_(device) {}

  pinned_buffer acquire(std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->capacity >= bytes && cudaEventQuery(it->done) == cudaSuccess) {
          const pinned_buffer b = *it;
          free_.erase(it);
          return b;
        }
    }
    pinned_buffer b;
    b.capacity = std::max<std::size_t>(4096, std::bit_ceil(bytes));
    check(cudaSetDevice(device_), "cudaSetDevice");
    void* host = nullptr;
    check(cudaHostAlloc(&host, b.capacity, cudaHostAllocPortable), "cudaHostAlloc");
    b.host = static_cast<std::byte*>(host);
    if (const cudaError_t e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming); e != cudaSuccess) {
      cudaFreeHost(host);
      check(e, "cudaEventCreateWithFlags");
    }
    return b;
  }

  /// Gives b back after recording its event behind the work queued so far (the copies that use
  /// it). Without the event recorded, b is not reused: a copy from it may still be pending.
  void release(const pinned_buffer& b) {
    if (cudaEventRecord(b.done, nullptr) != cudaSuccess) return;
    std::lock_guard lock(mutex_);
    free_.push_back(b);
  }

private:
  int device_;
  std::mutex mutex_;
  std::vector<pinned_buffer> free_;
};

pinned_pool& pool_of(int device) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<pinned_pool>> pools;
  std::lock_guard lock(mutex);
  if (pools.size() <= static_cast<std::size_t>(device)) pools.resize(static_cast<std::size_t>(device) + 1);
  auto& p = pools[static_cast<std::size_t>(device)];
  if (!p) p = std::make_unique<pinned_pool>(device);
  return *p;
}

/// Host arrays copied to the device in one asynchronous transfer (through a page-locked buffer)
/// into a block of the caching allocator. The block goes back to the cache when the staging is
/// destroyed; the kernels that read it are queued on the default stream, so a later use of the
/// same block is ordered after them.
class staging {
public:
  template <class T>
  std::size_t add(const std::vector<T>& v) {
    const std::size_t at = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes_.data() + at, v.data(), v.size() * sizeof(T));
    return at;
  }
  void upload(int device) {
    const std::size_t n = std::max<std::size_t>(bytes_.size(), 16);
    buffer_ = tensor::empty({static_cast<std::int64_t>(n)}, dtype::u8, troupe::device::cuda(device));
    auto& pool = pool_of(device);
    const pinned_buffer b = pool.acquire(n);
    std::memcpy(b.host, bytes_.data(), bytes_.size());
    const cudaError_t e = cudaMemcpyAsync(buffer_.bytes(), b.host, n, cudaMemcpyHostToDevice, nullptr);
    pool.release(b);
    check(e, "cudaMemcpyAsync");
  }
  template <class T>
  T* at(std::size_t offset) {
    return reinterpret_cast<T*>(buffer_.bytes() + offset);
  }

private:
  std::vector<std::byte> bytes_;
  tensor buffer_;
};

/// Tensor k's first thread block when each takes steps[k] elements: sizes.size() + 1 entries.
std::vector<std::int64_t> first_blocks(const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& steps) {
  std::vector<std::int64_t> first{0};
  for (std::size_t k = 0; k < sizes.size(); ++k) first.push_back(first.back() + (sizes[k] + steps[k] - 1) / steps[k]);
  return first;
}

unsigned grid_of(const std::vector<std::int64_t>& first) {
  if (first.back() > 0x7fffffff) throw std::invalid_argument("optimizer on CUDA: too many elements for one launch");
  return static_cast<unsigned>(first.back());
}

}  // namespace

std::int64_t resident_blocks(const void* kernel, int threads, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, std::int64_t> known;
  const auto key = std::make_tuple(kernel, threads, device);
  {
    std::lock_guard lock(mutex);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  int per_sm = 0, sms = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const std::int64_t n = static_cast<std::int64_t>(std::max(1, per_sm)) * std::max(1, sms);
  std::lock_guard lock(mutex);
  known[key] = n;
  return n;
}

namespace {

/// A list of tensors for one launch: descriptors, and each tensor's first work item.
struct launch_list {
  std::vector<tensor_update> tensors;
  std::vector<std::int64_t> sizes, steps;
  std::int64_t largest_block = 1;
  void add(const tensor_update& t, std::int64_t step) {
    tensors.push_back(t);
    sizes.push_back(t.n);
    steps.push_back(step);
    largest_block = std::max(largest_block, t.block);
  }
};

/// True when t's storage is the plain 8-bit layout (layout<Sgd, true>), in blocks a warp steps
/// (the plain kernel is built for 3 thread blocks of 256 threads per SM).
bool plain_8bit(bool sgd, const tensor_update& t) {
  if (t.block > 32 * lanes) return false;
  const bool m = t.m.mode == store_int8 && t.m.is_signed;
  const bool v = sgd ? t.v.mode == store_none : t.v.mode == store_int8 && !t.v.is_signed;
  return m && v && t.x.mode == store_none && !t.stochastic && t.percentile == 0;
}

/// The finiteness check of a step's gradients, staged.
struct check_plan {
  std::vector<std::int64_t> first;
  std::size_t grads_at = 0, sizes_at = 0, limits_at = 0, first_at = 0, flag_at = 0;

  void stage(staging& s, const std::vector<const float*>& grads, const std::vector<std::int64_t>& sizes,
             const std::vector<std::uint32_t>& limits) {
    first = first_blocks(sizes, std::vector<std::int64_t>(sizes.size(), finite_chunk));
    grads_at = s.add(grads);
    sizes_at = s.add(sizes);
    limits_at = s.add(limits);
    first_at = s.add(first);
    flag_at = s.add(std::vector<int>{0});
  }
  bool empty() const { return first.back() == 0; }
  /// Sets the flag at flag(s) when a gradient fails.
  void launch(staging& s) const {
    if (empty()) return;
    launch_finite_check(grid_of(first), s.at<const float* const>(grads_at), s.at<std::int64_t>(sizes_at),
                        s.at<std::uint32_t>(limits_at), s.at<std::int64_t>(first_at),
                        static_cast<int>(first.size() - 1), flag(s));
  }
  int* flag(staging& s) const { return s.at<int>(flag_at); }
};

/// The launches of an optimizer step, staged: three lists, a launch each: tensors without
/// 8-bit moments (chunks of `chunk`), with plain 8-bit ones and with others (a quantization
/// block per group of threads).
struct step_plan {
  launch_list lists[3];
  std::vector<std::int64_t> firsts[3];
  std::int64_t items[3] = {0, 0, 0};
  std::size_t tensors_at[3] = {0, 0, 0}, first_at[3] = {0, 0, 0};

  /// Throws std::invalid_argument for an 8-bit block the kernels do not take.
  step_plan(bool sgd, const std::vector<tensor_update>& tensors) {
    for (const auto& t : tensors) {
      const bool int8 = t.m.mode == store_int8 || t.v.mode == store_int8 || t.x.mode == store_int8;
      if (int8 && (t.block < 1 || t.block > max_int8_block))
        throw std::invalid_argument("optimizer on CUDA: 8-bit blocks of " + std::to_string(t.block) +
                                    " elements; the CUDA step handles at most " + std::to_string(max_int8_block));
      if (!int8) lists[0].add(t, chunk);
      else if (plain_8bit(sgd, t)) lists[1].add(t, t.block);
      else lists[2].add(t, t.block);
    }
    for (int k = 0; k < 3; ++k) {
      firsts[k] = first_blocks(lists[k].sizes, lists[k].steps);
      items[k] = static_cast<std::int64_t>(grid_of(firsts[k]));
    }
  }
  bool empty() const { return items[0] == 0 && items[1] == 0 && items[2] == 0; }
  void stage(staging& s) {
    for (int k = 0; k < 3; ++k) {
      tensors_at[k] = s.add(lists[k].tensors);
      first_at[k] = s.add(firsts[k]);
    }
  }
  /// The kernels return at once when `skip` (a device flag, or null) is set.
  void launch(bool sgd, staging& s, const int* skip, int device) const {
    for (int k = 0; k < 3; ++k) {
      if (items[k] == 0) continue;
      const auto* dt = s.at<const tensor_update>(tensors_at[k]);
      const auto* first = s.at<const std::int64_t>(first_at[k]);
      const int count = static_cast<int>(lists[k].tensors.size());
      const std::int64_t n = items[k], largest = lists[k].largest_block;
      if (k == 0) launch_elementwise_step(sgd, dt, first, count, n, skip, device);
      else launch_blockwise_step(sgd, k == 1, dt, first, count, n, largest, skip, device);
    }
  }
};

/// Copies the device flag at `flag` into a page-locked buffer behind the work queued so far,
/// then (after the caller queues more) waits for that copy alone: read() returns the flag.
class flag_reader {
public:
  flag_reader(int* flag, int device) : pool_(pool_of(device)), buffer_(pool_.acquire(sizeof(int))) {
    cudaError_t e = cudaMemcpyAsync(buffer_.host, flag, sizeof(int), cudaMemcpyDeviceToHost, nullptr);
    if (e == cudaSuccess) e = cudaEventRecord(buffer_.done, nullptr);
    error_ = e;
  }
  flag_reader(const flag_reader&) = delete;
  flag_reader& operator=(const flag_reader&) = delete;
  ~flag_reader() { pool_.release(buffer_); }
  int read() {
    if (error_ == cudaSuccess) error_ = cudaEventSynchronize(buffer_.done);
    check(error_, "reading the finiteness flag");
    int v = 0;
    std::memcpy(&v, buffer_.host, sizeof v);
    return v;
  }

private:
  pinned_pool& pool_;
  pinned_buffer buffer_;
  cudaError_t error_;
};

}  // namespace

bool all_finite(const std::vector<const float*>& grads, const std::vector<std::int64_t>& sizes,
                const std::vector<std::uint32_t>& limits, int device) {
  staging s;
  check_plan check;
  check.stage(s, grads, sizes, limits);
  if (check.empty()) return true;
  use_device(device);
  s.upload(device);
  check.launch(s);
  return flag_reader(check.flag(s), device).read() == 0;
}

std::vector<double> sums_of_squares(const std::vector<const float*>& grads, const std::vector<std::int64_t>& sizes,
                                    int device) {
  std::vector<double> sums(grads.size(), 0.0);
  const auto first = first_blocks(sizes, std::vector<std::int64_t>(sizes.size(), square_piece));
  const std::int64_t pieces = first.back();
  if (pieces == 0) return sums;
  staging s;
  const std::size_t grads_at = s.add(grads), sizes_at = s.add(sizes), first_at = s.add(first);
  const std::size_t out_at = s.add(std::vector<double>(static_cast<std::size_t>(pieces), 0.0));
  use_device(device);
  s.upload(device);
  launch_square_sums(s.at<const float* const>(grads_at), s.at<std::int64_t>(sizes_at), s.at<std::int64_t>(first_at),
                     static_cast<int>(first.size() - 1), pieces, s.at<double>(out_at));
  std::vector<double> partial(static_cast<std::size_t>(pieces));
  check(cudaMemcpy(partial.data(), s.at<double>(out_at), partial.size() * sizeof(double), cudaMemcpyDeviceToHost),
        "cudaMemcpy (sums of squares)");
  for (std::size_t k = 0; k < sizes.size(); ++k)
    for (std::int64_t b = first[k]; b < first[k + 1]; ++b) sums[k] += partial[static_cast<std::size_t>(b)];
  return sums;
}

void optimizer_step(bool sgd, const std::vector<tensor_update>& tensors, int device) {
  step_plan plan(sgd, tensors);
  if (plan.empty()) return;
  use_device(device);
  staging s;
  plan.stage(s);
  s.upload(device);
  plan.launch(sgd, s, nullptr, device);
}

bool checked_step(bool sgd, const std::vector<tensor_update>& tensors, const std::vector<const float*>& grads,
                  const std::vector<std::int64_t>& sizes, const std::vector<std::uint32_t>& limits, int device) {
  step_plan plan(sgd, tensors);
  staging s;
  check_plan check;
  check.stage(s, grads, sizes, limits);
  if (check.empty() && plan.empty()) return true;
  plan.stage(s);
  use_device(device);
  s.upload(device);
  check.launch(s);
  flag_reader flag(check.flag(s), device);
  plan.launch(sgd, s, check.flag(s), device);
  return flag.read() == 0;
}

void fill_zero(void* p, std::size_t bytes, int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaMemset(p, 0, bytes), "cudaMemset");
}

std::size_t free_memory(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

}  // namespace troupe::kernels::cuda
