#pragma once
// The threads a multithreaded CPU step runs on: made once per process and kept, so that a step
// does not pay for making and joining threads (tens of microseconds each, which a step of a
// million parameters on a machine with many cores would spend several times over).

#include <cstddef>
#include <type_traits>

namespace troupe::kernels::jobs {

/// fn(ctx, job, worker) for jobs 0..count-1 on the calling thread (worker 0) and up to
/// threads - 1 of the pool's (workers 1, 2, ...): each worker runs its jobs one after another, so
/// scratch indexed by worker is never shared. Returns when every job has run; rethrows the first
/// exception a job threw (the other jobs still run). Several callers may run at once: each gets
/// the pool threads that are free (at least its own thread). When no thread can be made (out of
/// memory or of threads), the ones there are share the jobs.
void run(std::size_t count, int threads, void (*fn)(void*, std::size_t, int), void* ctx);

/// run() with any callable fn(job, worker).
template <class F>
void run_jobs(std::size_t count, int threads, F&& fn) {
  if (threads <= 1 || count <= 1) {
    for (std::size_t j = 0; j < count; ++j) fn(j, 0);
    return;
  }
  using G = std::remove_reference_t<F>;
  run(count, threads, [](void* c, std::size_t j, int w) { (*static_cast<G*>(c))(j, w); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace troupe::kernels::jobs
