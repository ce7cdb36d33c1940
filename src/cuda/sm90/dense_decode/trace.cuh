// The dense decode kernel's timeline stamps (a diagnostic build only; NOTES.md "Diagnostics").
#pragma once

#include "cuda/sm90/dense_decode/launch.h"
#include "cuda/sm90/dense_decode/params.h"

namespace openmla::cuda::sm90 {
namespace dense_decode_detail {

// Timeline stamps (DenseDecodeParams::trace): one thread of each role of CTA (0,0,0) records
// clock64 at fixed points of its first trace_pairs pairs. Compiled in only with
// OPENMLA_DENSE_DECODE_TRACE (CMake option of the same name; research/profile_dense_decode.sh):
// the stamps cost the compute warpgroups registers they do not have to spare.
constexpr int kTraceEvents = 16;
struct Tracer {
#if defined(OPENMLA_DENSE_DECODE_TRACE)
  long long* row = nullptr;  // this role's [pair][event] rows, null when not tracing
  __device__ __forceinline__ Tracer(const DenseDecodeParams& p, int role, bool leader) {
    if (p.trace != nullptr && leader && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
      row = p.trace + static_cast<int64_t>(role) * p.trace_pairs * kTraceEvents;
      trace_pairs_ = p.trace_pairs;
    }
  }
  __device__ __forceinline__ void mark(int pair, int event) const {
    if (row != nullptr && pair < trace_pairs_) row[pair * kTraceEvents + event] = clock64();
  }
  // Request boundaries: role's [request][event] row after the CTA spans (params.h). The address
  // comes from the parameters at each mark: a pointer held across the loop cost registers. None
  // between a request's Q wait and its first wgmma: stamps there made ptxas put a
  // warpgroup.arrive before every wgmma of the kernel (92 instead of 23; C7519), and the trace
  // build ran 50% slower.
  __device__ __forceinline__ void mark_request(const DenseDecodeParams& p, int role, int request,
                                               int event) const {
    if (row != nullptr && request < kTraceRequests) {
      p.trace[3ll * p.trace_pairs * kTraceEvents + 6ll * kTraceMaxCtas +
              (role * kTraceRequests + request) * kTraceRequestEvents + event] = clock64();
    }
  }
  // mark_request once `value` (a load's result) has arrived: the branch on it waits for the
  // load, and the clock is read after the branch.
  __device__ __forceinline__ void mark_request_after(const DenseDecodeParams& p, int role,
                                                     int request, int event, int value) const {
    if (row != nullptr && value != kNeverValue) mark_request(p, role, request, event);
  }
  static constexpr int kNeverValue = -0x7fffffff;
  int trace_pairs_ = 0;
#else
  __device__ __forceinline__ Tracer(const DenseDecodeParams&, int, bool) {}
  __device__ __forceinline__ void mark(int, int) const {}
  __device__ __forceinline__ void mark_request(const DenseDecodeParams&, int, int, int) const {}
  __device__ __forceinline__ void mark_request_after(const DenseDecodeParams&, int, int, int,
                                                     int) const {}
#endif
};

}  // namespace dense_decode_detail
}  // namespace openmla::cuda::sm90
