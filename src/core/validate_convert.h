// Validation of kv_cache_convert (include/openmla/kv_convert.h), shared by both backends.
#pragma once

#include <cstdint>

#include "openmla/kv_convert.h"

namespace openmla::core {

struct KVCacheConvertShape {
  int64_t num_blocks;  // block pairs to convert (the lists' length, or every block)
  int64_t page_size, d_qk;
  bool block_lists;  // src_blocks/dst_blocks given
  Device device;
};

// Messages name the argument: "kv_cache_convert: dst.layout.page_size: expected 64 (src's page
// size), got 16". On the CPU the block ids are checked too (-1 or in [0, num_blocks)).
Status validate_kv_cache_convert(const KVCacheConvertArgs& args, KVCacheConvertShape* shape);

}  // namespace openmla::core
