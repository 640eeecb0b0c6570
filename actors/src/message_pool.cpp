// Recycles the small blocks that messages and cells live in.
//
// Messages are allocated by the sender's thread and freed by the receiver's. With the
// general-purpose allocator that steady flow from one thread to another misses the
// per-thread caches on both sides. Here each thread keeps a free list per size class; a thread
// that frees more than it allocates hands full batches of 64 blocks to a shared pool, from which
// a thread that allocates more than it frees takes whole batches: one lock per 64 blocks.
// Blocks come from and go back to ::operator new/delete; the pool keeps at most a bounded
// number of batches. Under sanitizers the pool is bypassed so that use-after-free stays visible.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

#include "sync.hpp"
#include "troupe/actors/detail/cell.hpp"

namespace troupe::detail {
namespace {

constexpr std::size_t granule = 32;
constexpr std::size_t classes = 8;  // 32, 64, ..., 256 bytes
constexpr std::uint32_t batch = 64;
constexpr std::size_t max_shared_batches = 4096;  // per class

struct free_block {
  free_block* next;
};

struct shared_pool {
  spinlock lock;
  std::vector<free_block*> batches[classes];
};

shared_pool& pool() {
  static shared_pool* p = new shared_pool;  // never destroyed: threads may free during exit
  return *p;
}

void release_list(free_block* b, std::size_t size) noexcept {
  while (b) {
    free_block* next = b->next;
    ::operator delete(static_cast<void*>(b), size);
    b = next;
  }
}

/// Set when this thread's cache is destroyed (trivially destructible, so still readable while
/// the thread's or the program's later destructors run: a static actor_system stops its actors
/// after the main thread's cache has gone). From then on this thread allocates plainly.
thread_local bool cache_gone = false;

struct thread_cache {
  free_block* head[classes] = {};
  std::uint32_t count[classes] = {};

  ~thread_cache() {
    cache_gone = true;
    for (std::size_t c = 0; c < classes; ++c) release_list(head[c], (c + 1) * granule);
  }

  void* take(std::size_t c) {
    if (head[c] == nullptr) {
      auto& p = pool();
      std::lock_guard lock(p.lock);
      if (!p.batches[c].empty()) {
        head[c] = p.batches[c].back();
        p.batches[c].pop_back();
        count[c] = batch;
      }
    }
    if (free_block* b = head[c]) {
      head[c] = b->next;
      --count[c];
      return b;
    }
    return ::operator new((c + 1) * granule);
  }

  void give(void* ptr, std::size_t c) noexcept {
    auto* b = static_cast<free_block*>(ptr);
    b->next = head[c];
    head[c] = b;
    if (++count[c] < 2 * batch) return;
    // Hand the older half over as one batch.
    free_block* cut = head[c];
    for (std::uint32_t i = 1; i < batch; ++i) cut = cut->next;
    free_block* spill = cut->next;
    cut->next = nullptr;
    count[c] = batch;
    auto& p = pool();
    {
      std::lock_guard lock(p.lock);
      if (p.batches[c].size() < max_shared_batches) {
        try {
          p.batches[c].push_back(spill);
          return;
        } catch (...) {
        }
      }
    }
    release_list(spill, (c + 1) * granule);
  }
};

thread_cache* cache() {
  if (cache_gone) return nullptr;
  thread_local thread_cache c;
  return &c;
}

#if defined(TROUPE_SANITIZED)
constexpr bool pooling = false;
#else
constexpr bool pooling = true;
#endif

}  // namespace

void* pool_allocate(std::size_t n) {
  if (!pooling || n > classes * granule) return ::operator new(n);
  const std::size_t c = (n - 1) / granule;
  if (auto* local = cache()) return local->take(c);
  return ::operator new((c + 1) * granule);  // (the size a pooled block of its class has)
}

void pool_free(void* p, std::size_t n) noexcept {
  if (!pooling || n > classes * granule) {
    ::operator delete(p, n);
    return;
  }
  const std::size_t c = (n - 1) / granule;
  if (auto* local = cache()) local->give(p, c);
  else ::operator delete(p, (c + 1) * granule);
}

}  // namespace troupe::detail
