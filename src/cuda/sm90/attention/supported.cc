// What each SM90 kernel family serves (supported.h).
#include "cuda/sm90/attention/supported.h"

#include "core/str_cat.h"

namespace openmla::cuda::sm90::attention {

const FamilySupport* family_support(std::string_view op) {
  for (const FamilySupport& family : kSupported) {
    if (op == family.op) return &family;
  }
  return nullptr;
}

bool supports(std::string_view op, DType dtype, int d_qk) {
  const FamilySupport* family = family_support(op);
  if (family == nullptr) return false;
  if (family->kernels == nullptr) return true;
  for (size_t i = 0; i < family->num_kernels; ++i) {
    if (family->kernels[i].dtype == dtype && family->kernels[i].d_qk == d_qk) return true;
  }
  return false;
}

std::string describe(const FamilySupport& family) {
  if (family.kernels == nullptr) return family.op;
  // Kernels of one dtype are listed together: "bf16 d_qk 576/512".
  std::string out = std::string(family.op) + " (";
  for (size_t i = 0; i < family.num_kernels; ++i) {
    const KernelShape& k = family.kernels[i];
    bool seen = false;
    for (size_t j = 0; j < i; ++j) seen = seen || family.kernels[j].dtype == k.dtype;
    if (seen) continue;
    out += core::str_cat(i > 0 ? ", " : "", dtype_name(k.dtype), " d_qk ", k.d_qk);
    for (size_t j = i + 1; j < family.num_kernels; ++j) {
      if (family.kernels[j].dtype == k.dtype) out += core::str_cat("/", family.kernels[j].d_qk);
    }
  }
  return out + ")";
}

std::string supported_ops() {
  std::string out;
  for (const FamilySupport& family : kSupported) {
    out += (out.empty() ? "" : ", ") + describe(family);
  }
  return out;
}

}  // namespace openmla::cuda::sm90::attention
