#!/bin/sh
# Thaw Node.js runtime launcher (like Lambda's /var/runtime/bootstrap): derive
# V8 heap limits from the function's memory size, then exec node on the shim.
# Runs as: /bin/sh /var/runtime/nodejs/bootstrap.sh   (see README.md)
m=${AWS_LAMBDA_FUNCTION_MEMORY_SIZE:-512}
case $m in ''|*[!0-9]*) m=512 ;; esac
[ "$m" -lt 64 ] && m=64
# young generation: 1/64 of memory split into two semi-spaces (1..16 MiB each)
semi=$((m / 128)); [ "$semi" -lt 1 ] && semi=1; [ "$semi" -gt 16 ] && semi=16
# old generation: ~85% of memory, leaving room for code, stacks, buffers
old=$((m * 85 / 100 - 2 * semi))
exec /usr/bin/node \
    --v8-pool-size=1 \
    --expose-gc \
    --max-semi-space-size="$semi" \
    --max-old-space-size="$old" \
    "${0%/*}/bootstrap.js" "$@"
