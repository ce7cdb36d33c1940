#!/usr/bin/env bash
# SASS instruction count of every kernel in the CUDA objects of a build tree, one line a kernel:
# "<object> <count> <kernel (mangled)>". Shows that a refactor left a tuned kernel's machine code
# alone: run it before and after, then diff the two outputs. With SASS_DUMP_DIR set, each
# object's full SASS goes there too (<object name>.sass, its source-path line dropped), so the
# instructions themselves can be diffed, not only their counts.
#   research/sass_counts.sh [build dir] [object path regex]
#   (defaults: build, 'dense_decode|combine|decode_schedule')
# cuobjdump and nvdisasm come with the CUDA toolkit; where it lacks them, the PyPI wheels
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry both (put their bin/ on PATH).
set -euo pipefail
build=${1:-build}
pattern=${2:-'dense_decode|combine|decode_schedule'}
objdir="$build/CMakeFiles/openmla_cuda.dir/src/cuda"
find "$objdir" -name '*.o' | grep -E "$pattern" | sort | while read -r obj; do
  name=${obj#"$objdir"/}
  sass=$(cuobjdump -sass "$obj")
  if [[ -n "${SASS_DUMP_DIR:-}" ]]; then
    mkdir -p "$SASS_DUMP_DIR"
    grep -v '^identifier = ' <<<"$sass" > "$SASS_DUMP_DIR/$(basename "$obj").sass"
  fi
  awk -v obj="$name" '
    /Function : / { if (fn != "") print obj, n, fn; fn = $3; n = 0; next }
    /^[ \t]+\/\*[0-9a-f]+\*\/ / { n++ }
    END { if (fn != "") print obj, n, fn }' <<<"$sass"
done
