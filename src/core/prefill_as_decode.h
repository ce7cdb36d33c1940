// Sparse prefill from a paged cache is sparse decode with the query tokens as its batch (the
// API's routing and the CUDA backend's internal entries share this view).
#pragma once

#include "openmla/ops.h"

namespace openmla::core {

// q [s_q, h_q, d] as [s_q, 1, h_q, d], indices [s_q, 1, topk] as they are, lse / max_logits
// [s_q, h_q] as [s_q, h_q, 1] (the size-1 dims' strides never move a pointer); the kv_cache as
// the k_cache, the rest as given.
SparseDecodeArgs sparse_prefill_as_decode(const SparsePrefillArgs& args);

}  // namespace openmla::core
