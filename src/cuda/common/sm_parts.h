// How many workers ("SM parts") a split-KV decode schedule deals its work over. The one place
// this rule lives: the backend's decode_num_sm_parts, the schedule planner and the decode
// launchers all call decode_sm_parts_for.
//
// A decode CTA serves kDecodeRowsPerCta query rows of one kv head (the s_q * h_q / h_kv rows
// that share it, padded to 64). One request at one split therefore needs
//   ctas_per_part = h_kv * ceil(s_q * h_q / h_kv / 64)
// CTAs side by side, and the SMs are shared out in such groups: num_sm_parts = num_sms /
// ctas_per_part (at least 1), so every part's CTAs are resident at once, one CTA per SM.
// Example, H200 (132 SMs): h_q 128, s_q 1, h_kv 1 -> 2 CTAs per part -> 66 parts;
// h_q 16 -> 1 CTA per part -> 132 parts.
#pragma once

namespace openmla::cuda {

constexpr int kDecodeRowsPerCta = 64;

constexpr int decode_ctas_per_sm_part(int s_q, int h_q, int h_kv) {
  const int rows_per_kv_head = s_q * h_q / h_kv;
  return h_kv * ((rows_per_kv_head + kDecodeRowsPerCta - 1) / kDecodeRowsPerCta);
}

constexpr int decode_sm_parts_for(int num_sms, int s_q, int h_q, int h_kv) {
  const int ctas = decode_ctas_per_sm_part(s_q, h_q, h_kv);
  const int parts = ctas > 0 ? num_sms / ctas : num_sms;
  return parts > 1 ? parts : 1;
}

static_assert(decode_sm_parts_for(132, 1, 128, 1) == 66);
static_assert(decode_sm_parts_for(132, 1, 16, 1) == 132);
static_assert(decode_sm_parts_for(132, 2, 128, 1) == 33);
static_assert(decode_sm_parts_for(8, 4, 128, 1) == 1);

}  // namespace openmla::cuda
