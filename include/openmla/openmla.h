// OpenMLA: Multi-head Latent Attention kernels. The one header a caller includes.
#pragma once

#include "openmla/fused_attention.h"
#include "openmla/kv_convert.h"
#include "openmla/kv_format.h"
#include "openmla/ops.h"
#include "openmla/status.h"
#include "openmla/tensor.h"
#include "openmla/version.h"
