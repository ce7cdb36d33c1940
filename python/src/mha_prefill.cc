// openmla._C's dense MHA prefill functions (include/openmla/ops.h, MhaPrefillArgs): the arrays
// become views, the GIL is released around the call, a failed Status raises its exception.
// Outputs and the backward's workspace (CUDA: mha_prefill_backward_workspace_size bytes, uint8)
// are passed in; openmla/_mha_prefill.py allocates them.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "convert.h"
#include "openmla/ops.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace openmla::python {
namespace {

using OptArray = std::optional<Array>;

template <typename Call>
void run_released(Call&& call) {
  Status status;
  {
    nb::gil_scoped_release release;
    status = call();
  }
  throw_if_error(status);
}

void mha_prefill_py(const Array& q, const Array& k, const Array& v, const Array& cu_seqlens_q,
                    const Array& cu_seqlens_kv, const Array& out, const Array& lse,
                    int64_t max_seqlen_q, int64_t max_seqlen_kv, bool causal, float softmax_scale,
                    uintptr_t stream) {
  const char* op = "mha_prefill";
  MhaPrefillArgs a;
  a.q = to_view(q, op, "q");
  a.k = to_view(k, op, "k");
  a.v = to_view(v, op, "v");
  a.cu_seqlens_q = to_view(cu_seqlens_q, op, "cu_seqlens_q");
  a.cu_seqlens_kv = to_view(cu_seqlens_kv, op, "cu_seqlens_kv");
  a.max_seqlen_q = max_seqlen_q;
  a.max_seqlen_kv = max_seqlen_kv;
  a.causal = causal;
  a.softmax_scale = softmax_scale;
  a.out = to_view(out, op, "out");
  a.lse = to_view(lse, op, "lse");
  run_released([&] { return mha_prefill(a, to_stream(stream)); });
}

void mha_prefill_backward_py(const Array& dout, const Array& q, const Array& k, const Array& v,
                             const Array& out, const Array& lse, const Array& cu_seqlens_q,
                             const Array& cu_seqlens_kv, const Array& dq, const Array& dk,
                             const Array& dv, int64_t max_seqlen_q, int64_t max_seqlen_kv,
                             bool causal, float softmax_scale, const OptArray& workspace,
                             uintptr_t stream) {
  const char* op = "mha_prefill_backward";
  MhaPrefillBackwardArgs a;
  a.dout = to_view(dout, op, "dout");
  a.q = to_view(q, op, "q");
  a.k = to_view(k, op, "k");
  a.v = to_view(v, op, "v");
  a.out = to_view(out, op, "out");
  a.lse = to_view(lse, op, "lse");
  a.cu_seqlens_q = to_view(cu_seqlens_q, op, "cu_seqlens_q");
  a.cu_seqlens_kv = to_view(cu_seqlens_kv, op, "cu_seqlens_kv");
  a.max_seqlen_q = max_seqlen_q;
  a.max_seqlen_kv = max_seqlen_kv;
  a.causal = causal;
  a.softmax_scale = softmax_scale;
  a.dq = to_view(dq, op, "dq");
  a.dk = to_view(dk, op, "dk");
  a.dv = to_view(dv, op, "dv");
  a.workspace = to_workspace(workspace, op);
  run_released([&] { return mha_prefill_backward(a, to_stream(stream)); });
}

// Bytes of workspace mha_prefill_backward needs for this shape on the device (0 on the CPU).
size_t mha_prefill_backward_workspace_size_py(const std::string& device_type, int device_index,
                                              int64_t total_q, int64_t total_kv, int64_t h_q,
                                              int64_t h_kv, int64_t d_qk, int64_t d_v) {
  const char* op = "mha_prefill_backward_workspace_size";
  const std::pair<const char*, int64_t> args[] = {{"total_q", total_q}, {"total_kv", total_kv},
                                                  {"h_q", h_q},         {"h_kv", h_kv},
                                                  {"d_qk", d_qk},       {"d_v", d_v}};
  for (const auto& [name, value] : args) {
    if (value < 0) {
      throw_value_error(std::string(op) + ": " + name + ": expected >= 0, got " +
                        std::to_string(value));
    }
  }
  return mha_prefill_backward_workspace_size(parse_device(device_type, device_index, op), total_q,
                                             total_kv, h_q, h_kv, d_qk, d_v);
}

}  // namespace

void register_mha_prefill(nb::module_& m) {
  m.def("mha_prefill", &mha_prefill_py, "q"_a, "k"_a, "v"_a, "cu_seqlens_q"_a, "cu_seqlens_kv"_a,
        "out"_a, "lse"_a, "max_seqlen_q"_a, "max_seqlen_kv"_a, "causal"_a = false,
        "softmax_scale"_a = 0.f, "stream"_a = 0);
  m.def("mha_prefill_backward", &mha_prefill_backward_py, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a,
        "lse"_a, "cu_seqlens_q"_a, "cu_seqlens_kv"_a, "dq"_a, "dk"_a, "dv"_a, "max_seqlen_q"_a,
        "max_seqlen_kv"_a, "causal"_a = false, "softmax_scale"_a = 0.f,
        "workspace"_a = nb::none(), "stream"_a = 0);
  m.def("mha_prefill_backward_workspace_size", &mha_prefill_backward_workspace_size_py,
        "device_type"_a, "device_index"_a, "total_q"_a, "total_kv"_a, "h_q"_a, "h_kv"_a, "d_qk"_a,
        "d_v"_a);
}

}  // namespace openmla::python
