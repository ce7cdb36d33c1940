#include "cuda/sm90/sparse_decode/tuning.h"

#include "core/prefill_as_decode.h"
#include "core/validate.h"
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/sparse_decode/launch.h"
#include "cuda/sm90/sparse_prefill/launch.h"

namespace openmla::cuda::sm90 {
namespace {

// The device checks of the production path (cuda/backend.cc), then `call` on that device.
template <class Call>
Status on_device(const char* op, Device device, Call&& call) {
  attention::DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(attention::require_sm90(op, device, &facts));
  attention::DeviceGuard guard;
  OPENMLA_RETURN_IF_ERROR(guard.enter(op, device.index));
  return call();
}

}  // namespace

Status sparse_decode_with_tuning(const SparseDecodeArgs& args, const core::SparseTuning& tuning,
                                 cudaStream_t stream) {
  core::SparseDecodeShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_sparse_decode(args, &shape));
  return on_device("sparse_decode", shape.device,
                   [&] { return sparse_decode(args, shape, stream, tuning); });
}

Status sparse_prefill_with_tuning(const SparsePrefillArgs& args, const core::SparseTuning& tuning,
                                  cudaStream_t stream) {
  core::SparsePrefillShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_sparse_prefill(args, &shape));
  if (args.fp8_tensor_cores) {
    return Status::InvalidArgument(
        "sparse_prefill_with_tuning: fp8_tensor_cores: the FP8 path takes no tuning");
  }
  return on_device("sparse_prefill", shape.device, [&] {
    if (!args.kv_cache.defined()) return sparse_prefill(args, shape, stream, tuning);
    if (sparse_prefill_dequantizes_once(args, shape, tuning.dequant_once)) {
      return sparse_prefill_dequant_once(args, shape, stream);
    }
    const SparseDecodeArgs d = core::sparse_prefill_as_decode(args);
    core::SparseDecodeShape dshape;
    OPENMLA_RETURN_IF_ERROR(core::validate_sparse_decode(d, &dshape));
    return sparse_decode(d, dshape, stream, tuning);
  });
}

}  // namespace openmla::cuda::sm90
