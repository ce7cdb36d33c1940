// Sparse prefill from a quantised paged cache with each named slot dequantised once (launch.h).
// The direct path (sparse decode with the query tokens as its batch) decodes a key in every CTA
// that gathers it: s_q · topk · m_blocks decodes, 256 a slot at s_q 4096, topk 2048 over 32768
// slots. Here, all on the stream and with no host sync (CUDA-graph safe):
//   1. mark the slots the kept indices name in a bitmap (bit slot % 32 of word slot / 32);
//   2. an exclusive scan of the words' popcounts gives each word's first compact row (CUB), the
//      scan's last entry the count;
//   3. list the marked slots in slot order and dequantise them into bf16 rows by the KV-cache
//      gather kernel, which reads the count on the device;
//   4. rewrite the indices into row numbers (a slot's rank among the marked ones; -1 for an
//      invalid index or one past topk_length);
//   5. the bf16 prefill on those rows.
// Rows are at most min(slots, s_q · topk), so the workspace is sized by the worst case and no row
// past the count is ever written or read.
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstdint>

#include "core/sparse_kernel_plan.h"
#include "core/str_cat.h"
#include "cuda/common/kv_cache_kernels.h"
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/sparse_prefill/fp8_launch.h"
#include "cuda/sm90/sparse_prefill/launch.h"

namespace openmla::cuda::sm90 {
namespace {

using attention::cuda_error;

constexpr int kThreads = 256;

// indices [s_q, 1, topk] (any strides) with the optional topk_length [s_q].
struct IndexRows {
  const int32_t* idx;
  int64_t stride_t, stride_k;
  const int32_t* len;
  int64_t len_stride;
  int64_t s_q, topk, num_slots;
};

__device__ __forceinline__ int64_t kept(const IndexRows& r, int64_t t) {
  if (r.len == nullptr) return r.topk;
  const int64_t l = __ldg(r.len + t * r.len_stride);
  return l < 0 ? 0 : (l > r.topk ? r.topk : l);  // clamped to [0, topk], as the kernels do
}

__device__ __forceinline__ int32_t index_at(const IndexRows& r, int64_t t, int64_t k) {
  return __ldg(r.idx + t * r.stride_t + k * r.stride_k);
}

// Step 1. Most indices repeat a slot already marked, and the marked slots' words are few (1024
// for 32768 slots: 32 lines of L2), so every index's atomic, or its read of the word from L2,
// would queue on a few L2 lines (sparse_decode/NOTES.md has the measurement). A block keeps a
// direct-mapped filter in shared memory of the words it has marked: entry = word << 32 | bits
// that atomicOr returned set (a subset of the word's bits in memory, whichever thread stored it
// last, as a 64-bit store is whole), and skips an index whose bit the entry holds. Four blocks
// an SM walk the tokens (kMarkBlocksPerSm), so each sends about one atomic a word it touches;
// a thread loads kMarkLoads indices before marking any, to keep enough reads in flight.
constexpr int kFilterEntries = 4096;  // 32 KB
constexpr int kMarkBlocksPerSm = 4;
constexpr int kMarkLoads = 4;
// Each valid index of the tokens this block walks, as mark(slot): a thread loads kMarkLoads
// indices before marking any, to keep enough reads in flight.
template <int kBlockThreads, class Mark>
__device__ __forceinline__ void for_each_named_slot(const IndexRows& r, Mark&& mark) {
  for (int64_t t = blockIdx.x; t < r.s_q; t += gridDim.x) {
    const int64_t len = kept(r, t);
    for (int64_t k0 = threadIdx.x; k0 < len; k0 += kMarkLoads * kBlockThreads) {
      int32_t slots[kMarkLoads];
#pragma unroll
      for (int j = 0; j < kMarkLoads; ++j) {
        const int64_t k = k0 + j * kBlockThreads;
        slots[j] = k < len ? index_at(r, t, k) : -1;
      }
#pragma unroll
      for (int j = 0; j < kMarkLoads; ++j) {
        if (slots[j] >= 0 && slots[j] < r.num_slots) mark(slots[j]);  // else never a row
      }
    }
  }
}
__global__ void __launch_bounds__(kThreads) mark_named_slots(const IndexRows r, uint32_t* bitmap) {
  __shared__ unsigned long long filter[kFilterEntries];
  for (int i = threadIdx.x; i < kFilterEntries; i += kThreads) filter[i] = ~0ull;  // no word
  __syncthreads();
  for_each_named_slot<kThreads>(r, [&](int32_t slot) {
    const uint32_t w = static_cast<uint32_t>(slot) >> 5, bit = 1u << (slot & 31);
    unsigned long long* entry = filter + (w & (kFilterEntries - 1));
    const unsigned long long e = *entry;
    if ((e >> 32) == w && (e & bit) != 0) return;
    const uint32_t set = atomicOr(bitmap + w, bit) | bit;
    *entry = static_cast<unsigned long long>(w) << 32 | set;
  });
}

// Step 2's input: counts[w] = popcount(bitmap[w]), counts[words] = 0 (its scan is the total).
__global__ void __launch_bounds__(kThreads)
    count_marked(const uint32_t* bitmap, int64_t words, int32_t* counts) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (w < words) counts[w] = __popc(bitmap[w]);
  if (w == words) counts[w] = 0;
}

// Step 3's list: slots[first[w] + j] = the j-th marked slot of word w.
__global__ void __launch_bounds__(kThreads)
    list_marked(const uint32_t* bitmap, const int32_t* first, int64_t words, int32_t* slots) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (w >= words) return;
  uint32_t bits = bitmap[w];
  int32_t at = first[w];
  while (bits != 0) {
    slots[at++] = static_cast<int32_t>(w * 32 + (__ffs(bits) - 1));
    bits &= bits - 1;
  }
}

// Step 4: rows[t, k] (contiguous [s_q, topk]).
__global__ void __launch_bounds__(kThreads) remap_indices(const IndexRows r, const uint32_t* bitmap,
                                                          const int32_t* first, int32_t* rows) {
  for (int64_t t = blockIdx.x; t < r.s_q; t += gridDim.x) {
    const int64_t len = kept(r, t);
    for (int64_t k = threadIdx.x; k < r.topk; k += kThreads) {
      int32_t row = -1;
      if (k < len) {
        const int32_t slot = index_at(r, t, k);
        if (slot >= 0 && slot < r.num_slots) {
          const int32_t w = slot >> 5;
          row = first[w] + __popc(__ldg(bitmap + w) & ((1u << (slot & 31)) - 1u));
        }
      }
      rows[t * r.topk + k] = row;
    }
  }
}

// The workspace's parts, in bytes from its start (each 256-aligned: attention::WorkspaceCarver).
struct Layout {
  int64_t rows = 0;   // compact bf16 rows reserved: min(slots, s_q · topk)
  int64_t words = 0;  // bitmap words
  size_t row_data = 0, indices = 0, bitmap = 0, counts = 0, first = 0, slots = 0, scan = 0,
         prefill = 0;
  size_t scan_bytes = 0, prefill_bytes = 0, total = 0;
};

Status plan_layout(int device_index, int64_t s_q, int64_t h_q, int64_t d_v, int64_t topk,
                   const KVCache& cache, Layout* l) {
  const int64_t d_qk = kv_format_info(cache.layout.format, cache.layout.d_qk).d_qk;
  l->rows = core::prefill_compact_rows(s_q, topk, cache.num_tokens());
  l->words = (cache.num_tokens() + 31) / 32;
  attention::WorkspaceCarver carve;
  auto take = [&](size_t bytes) { return carve.take(bytes); };
  l->row_data = take(static_cast<size_t>(l->rows) * d_qk * 2);
  l->indices = take(static_cast<size_t>(s_q) * topk * 4);
  l->bitmap = take(static_cast<size_t>(l->words) * 4);
  l->counts = take(static_cast<size_t>(l->words + 1) * 4);
  l->first = take(static_cast<size_t>(l->words + 1) * 4);
  l->slots = take(static_cast<size_t>(l->rows) * 4);
  size_t scan_bytes = 0;
  const cudaError_t err = cub::DeviceScan::ExclusiveSum(
      nullptr, scan_bytes, static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<int>(l->words + 1));
  if (err != cudaSuccess) {
    return cuda_error("sparse_prefill", "cub::DeviceScan::ExclusiveSum (size)", err);
  }
  l->scan_bytes = scan_bytes;
  l->scan = take(scan_bytes);
  l->prefill_bytes = sparse_prefill_workspace_size(device_index, static_cast<int>(s_q),
                                                   static_cast<int>(h_q), static_cast<int>(d_v));
  l->prefill = take(l->prefill_bytes);
  l->total = carve.total;
  return Status::Ok();
}

bool quantised(KVFormat f) { return kv_format_info(f).quantized(); }  // fp8_*, fp4

unsigned grid_for(int64_t n, int64_t cap) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(n, cap)));
}

}  // namespace

size_t sparse_prefill_cache_workspace_size(int device_index, int s_q, int h_q, int d_v,
                                           int64_t topk, const KVCache& cache) {
  const size_t base = sparse_prefill_workspace_size(device_index, s_q, h_q, d_v);
  if (!quantised(cache.layout.format) || s_q <= 0 || topk <= 0 || cache.num_tokens() <= 0) {
    return base;
  }
  Layout l;
  if (!plan_layout(device_index, s_q, h_q, d_v, topk, cache, &l).ok()) return base;
  return std::max(base, l.total);
}

bool sparse_prefill_dequantizes_once(const SparsePrefillArgs& args,
                                     const core::SparsePrefillShape& shape, int dequant_once) {
  const KVCache& cache = args.kv_cache;
  if (!cache.defined() || !quantised(cache.layout.format) || shape.d_v != 512) return false;
  core::PrefillFromCacheShape s;
  s.s_q = shape.s_q;
  s.topk = shape.topk;
  s.h_q = shape.h_q;
  s.num_slots = cache.num_tokens();
  s.quantised = true;
  // (the rows are read by 16-byte copies: a misaligned workspace takes the direct path)
  s.workspace_fits = args.workspace.data != nullptr &&
                     reinterpret_cast<uintptr_t>(args.workspace.data) % 16 == 0 &&
                     args.workspace.bytes >=
                     sparse_prefill_cache_workspace_size(shape.device.index,
                                                         static_cast<int>(shape.s_q),
                                                         static_cast<int>(shape.h_q),
                                                         static_cast<int>(shape.d_v), shape.topk,
                                                         cache);
  // The compact rows' count and slot numbers are int32 (indices are).
  if (s.num_slots > INT32_MAX) return false;
  return core::prefill_dequantizes_once(s, dequant_once);
}

namespace {

// Steps 1-4 (above) into the workspace laid out as `l`: the marked slots listed in `slots`, their
// count at first[words] (on the device), and the indices rewritten into row numbers.
Status list_named_slots(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                        const Layout& l, cudaStream_t stream) {
  constexpr const char* kOp = "sparse_prefill";
  const KVCache& cache = args.kv_cache;
  if (args.workspace.bytes < l.total || args.workspace.data == nullptr ||
      reinterpret_cast<uintptr_t>(args.workspace.data) % 16 != 0) {
    return Status::InvalidArgument(core::str_cat(
        kOp, ": workspace: ", args.fp8_tensor_cores ? "the FP8 tensor-core path" :
        "dequantising each named slot once", " needs ", l.total,
        " bytes on 16 (sparse_prefill_workspace_size with topk and kv_cache), got ",
        args.workspace.bytes, " bytes at ", args.workspace.data));
  }
  char* ws = static_cast<char*>(args.workspace.data);
  auto* row_indices = reinterpret_cast<int32_t*>(ws + l.indices);
  auto* bitmap = reinterpret_cast<uint32_t*>(ws + l.bitmap);
  auto* counts = reinterpret_cast<int32_t*>(ws + l.counts);
  auto* first = reinterpret_cast<int32_t*>(ws + l.first);
  auto* slots = reinterpret_cast<int32_t*>(ws + l.slots);

  IndexRows r;
  r.idx = args.indices.data_as<const int32_t>();
  r.stride_t = args.indices.strides[0];
  r.stride_k = args.indices.strides[2];
  r.len = args.topk_length.defined() ? args.topk_length.data_as<const int32_t>() : nullptr;
  r.len_stride = args.topk_length.defined() ? args.topk_length.strides[0] : 0;
  r.s_q = shape.s_q;
  r.topk = shape.topk;
  r.num_slots = cache.num_tokens();

  const int64_t word_blocks = (l.words + 1 + kThreads - 1) / kThreads;
  const unsigned token_blocks = grid_for(shape.s_q, 8192);
  attention::DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(attention::device_facts(kOp, shape.device.index, &facts));
  OPENMLA_RETURN_IF_ERROR(cuda_error(
      kOp, "cudaMemsetAsync", cudaMemsetAsync(bitmap, 0, static_cast<size_t>(l.words) * 4, stream)));
  const unsigned mark_blocks =
      grid_for(shape.s_q, kMarkBlocksPerSm * static_cast<int64_t>(facts.num_sms));
  mark_named_slots<<<mark_blocks, kThreads, 0, stream>>>(r, bitmap);
  count_marked<<<grid_for(word_blocks, INT32_MAX), kThreads, 0, stream>>>(bitmap, l.words, counts);
  size_t scan_bytes = l.scan_bytes;
  OPENMLA_RETURN_IF_ERROR(cuda_error(
      kOp, "cub::DeviceScan::ExclusiveSum",
      cub::DeviceScan::ExclusiveSum(ws + l.scan, scan_bytes, counts, first,
                                    static_cast<int>(l.words + 1), stream)));
  list_marked<<<grid_for(word_blocks, INT32_MAX), kThreads, 0, stream>>>(bitmap, first, l.words,
                                                                          slots);
  remap_indices<<<token_blocks, kThreads, 0, stream>>>(r, bitmap, first, row_indices);
  return cuda_error(kOp, "kernel launch", cudaGetLastError());
}

}  // namespace

Status sparse_prefill_dequant_once(const SparsePrefillArgs& args,
                                   const core::SparsePrefillShape& shape, cudaStream_t stream) {
  const KVCache& cache = args.kv_cache;
  Layout l;
  OPENMLA_RETURN_IF_ERROR(plan_layout(shape.device.index, shape.s_q, shape.h_q, shape.d_v,
                                      shape.topk, cache, &l));
  OPENMLA_RETURN_IF_ERROR(list_named_slots(args, shape, l, stream));
  char* ws = static_cast<char*>(args.workspace.data);
  auto* row_data = reinterpret_cast<uint16_t*>(ws + l.row_data);
  auto* row_indices = reinterpret_cast<int32_t*>(ws + l.indices);
  auto* first = reinterpret_cast<int32_t*>(ws + l.first);
  auto* slots = reinterpret_cast<int32_t*>(ws + l.slots);
  // first[words] is the count of marked slots, on the device.
  OPENMLA_RETURN_IF_ERROR(kv_cache_gather_listed_launch(cache, shape.d_qk, slots, first + l.words,
                                                        l.rows, row_data, stream));

  // The bf16 prefill over the rows: kv [rows, 1, d_qk], indices [s_q, 1, topk] contiguous.
  const int64_t d_qk = shape.d_qk;
  SparsePrefillArgs b = args;
  b.kv_cache = KVCache{};
  b.kv.data = row_data;
  b.kv.dtype = DType::kBF16;
  b.kv.rank = 3;
  b.kv.shape[0] = l.rows;
  b.kv.shape[1] = 1;
  b.kv.shape[2] = d_qk;
  b.kv.strides[0] = d_qk;
  b.kv.strides[1] = d_qk;
  b.kv.strides[2] = 1;
  b.kv.device = shape.device;
  b.indices.data = row_indices;
  b.indices.dtype = DType::kInt32;
  b.indices.rank = 3;
  b.indices.shape[0] = shape.s_q;
  b.indices.shape[1] = 1;
  b.indices.shape[2] = shape.topk;
  b.indices.strides[0] = shape.topk;
  b.indices.strides[1] = shape.topk;
  b.indices.strides[2] = 1;
  b.indices.device = shape.device;
  b.workspace = {ws + l.prefill, l.prefill_bytes};
  core::SparsePrefillShape bs = shape;
  bs.s_kv = l.rows;
  bs.h_kv = 1;
  return sparse_prefill(b, bs, stream);
}


// The FP8 tensor-core path (fp8_kernel.cuh): steps 1, 2 and 4 as above; step 3 writes each named
// slot as an e4m3 row of one power-of-two scale (640 B and a float a row: within the bf16 rows'
// d_qk * 2 bytes a row); then the FP8 kernel over those rows.
Status sparse_prefill_fp8(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                          cudaStream_t stream) {
  constexpr const char* kOp = "sparse_prefill";
  const KVCache& cache = args.kv_cache;
  if (!cache.defined() || !quantised(cache.layout.format)) {
    return Status::InvalidArgument(core::str_cat(
        kOp, ": fp8_tensor_cores: needs kv_cache in a quantised format (fp8_v32, fp8_model1, "
             "fp8_mx, fp4)"));
  }
  if (shape.d_v != 512 || (shape.d_qk != 576 && shape.d_qk != 512)) {
    return Status::NotImplemented(core::str_cat(kOp, ": fp8_tensor_cores: d_qk ", shape.d_qk,
                                                ", d_v ", shape.d_v,
                                                " (the FP8 path has d_qk 576 or 512, d_v 512)"));
  }
  if (cache.num_tokens() > INT32_MAX) {
    return Status::InvalidArgument(core::str_cat(
        kOp, ": kv_cache: ", cache.num_tokens(), " slots; int32 indices address at most 2^31"));
  }
  const TensorView& q = args.q;
  if (reinterpret_cast<uintptr_t>(q.data) % 16 != 0 || q.strides[0] % 8 != 0 ||
      q.strides[1] % 8 != 0) {
    return Status::NotImplemented(core::str_cat(
        kOp, ": q: the FP8 path reads q's rows by 16-byte loads; expected a 16-byte aligned "
             "pointer and token and head strides that are multiples of 8 elements, got strides (",
        q.strides[0], ", ", q.strides[1], ")"));
  }
  Layout l;
  OPENMLA_RETURN_IF_ERROR(plan_layout(shape.device.index, shape.s_q, shape.h_q, shape.d_v,
                                      shape.topk, cache, &l));
  static_assert(fp8_prefill::kRowBytes + 4 <= 512 * 2, "an e4m3 row in a bf16 row's room");
  OPENMLA_RETURN_IF_ERROR(list_named_slots(args, shape, l, stream));
  char* ws = static_cast<char*>(args.workspace.data);
  auto* rows = reinterpret_cast<uint8_t*>(ws + l.row_data);
  auto* scales =
      reinterpret_cast<float*>(ws + l.row_data + static_cast<size_t>(l.rows) * fp8_prefill::kRowBytes);
  auto* row_indices = reinterpret_cast<int32_t*>(ws + l.indices);
  auto* first = reinterpret_cast<int32_t*>(ws + l.first);
  auto* slots = reinterpret_cast<int32_t*>(ws + l.slots);
  OPENMLA_RETURN_IF_ERROR(kv_cache_gather_listed_fp8_launch(
      cache, shape.d_qk, slots, first + l.words, l.rows, rows, scales, stream));

  Fp8PrefillParams p = {};
  p.q = q.data_as<const uint16_t>();
  p.q_stride_t = q.strides[0];
  p.q_stride_h = q.strides[1];
  p.out = args.out.data_as<uint16_t>();
  p.out_stride_t = args.out.strides[0];
  p.out_stride_h = args.out.strides[1];
  p.lse = args.lse.data_as<float>();
  p.lse_stride_t = args.lse.strides[0];
  p.lse_stride_h = args.lse.strides[1];
  p.max_logits = args.max_logits.data_as<float>();
  p.max_logits_stride_t = args.max_logits.strides[0];
  p.max_logits_stride_h = args.max_logits.strides[1];
  p.rows = rows;
  p.row_scales = scales;
  p.row_index = row_indices;
  if (args.topk_length.defined()) {
    p.lengths = args.topk_length.data_as<const int32_t>();
    p.lengths_stride = args.topk_length.strides[0];
  }
  if (args.attn_sink.defined()) {
    p.sink = args.attn_sink.data_as<const float>();
    p.sink_stride = args.attn_sink.strides[0];
  }
  p.h_q = static_cast<int>(shape.h_q);
  p.topk = static_cast<int>(shape.topk);
  p.scale = shape.softmax_scale;
  const int m_blocks = static_cast<int>((shape.h_q + 63) / 64);
  for (int64_t t0 = 0; t0 < shape.s_q; t0 += 65535) {
    p.token0 = t0;
    const int tokens = static_cast<int>(std::min<int64_t>(65535, shape.s_q - t0));
    const cudaError_t err = shape.d_qk == 576
                                ? launch_sparse_prefill_fp8<576>(p, m_blocks, tokens, stream)
                                : launch_sparse_prefill_fp8<512>(p, m_blocks, tokens, stream);
    OPENMLA_RETURN_IF_ERROR(cuda_error(kOp, "sparse_prefill_fp8_kernel launch", err));
  }
  return Status::Ok();
}

}  // namespace openmla::cuda::sm90
