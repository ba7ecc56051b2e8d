#!/bin/sh
# Thaw Java runtime launcher (like Lambda's java17 bootstrap): derive the heap
# from the function's memory size, then exec the JVM on the shim.
# Runs as: /bin/sh /var/runtime/java/bootstrap.sh   (flags explained in README.md)
m=${AWS_LAMBDA_FUNCTION_MEMORY_SIZE:-512}
case $m in ''|*[!0-9]*) m=512 ;; esac
[ "$m" -lt 64 ] && m=64
heap=$((m * 70 / 100))      # the rest: metaspace, code cache, thread stacks, malloc
meta=$((m / 4)); [ "$meta" -lt 48 ] && meta=48
task=${LAMBDA_TASK_ROOT:-/var/task}
jar="${0%/*}/thaw-java-runtime.jar"
if [ ! -f "$jar" ]; then
    echo "thaw: the Java runtime jar ($jar) is missing: run scripts/build-runtimes.sh, then restart thaw" >&2
    exit 127
fi
# A base (THAW_BASE=1) starts before any function is known: the shim alone; the
# function's class path is appended to the system class loader's later
# (Bootstrap.bundleLoader, through jdk.internal.loader, which is opened to it).
if [ "$THAW_BASE" = 1 ]; then
    cp="$jar"
    loader=--add-opens=java.base/jdk.internal.loader=ALL-UNNAMED
else
    cp="$jar:$task:$task/lib/*:$task/*:/opt/java/lib/*"
    loader=
fi
exec ${JAVA_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}/bin/java \
    -XX:-UsePerfData \
    -Xshare:auto \
    -XX:+UseSerialGC \
    -XX:TieredStopAtLevel=1 \
    -XX:CICompilerCount=1 \
    -XX:-UseNotificationThread \
    -XX:+ReduceSignalUsage \
    -XX:+DisableAttachMechanism \
    -Xss512k \
    -XX:MaxHeapSize="${heap}m" \
    -XX:InitialHeapSize=8m \
    -XX:MinHeapFreeRatio=10 \
    -XX:MaxHeapFreeRatio=20 \
    -XX:MaxMetaspaceSize="${meta}m" \
    -XX:ReservedCodeCacheSize=32m \
    -Djava.security.egd=file:/dev/urandom \
    -Djava.net.preferIPv4Stack=true \
    -Dfile.encoding=UTF-8 \
    -Duser.home=/tmp \
    -Dthaw.native="${0%/*}/libthawenv.so" \
    --add-opens=java.base/java.io=ALL-UNNAMED \
    --add-opens=java.base/java.lang=ALL-UNNAMED \
    --add-opens=java.base/java.util=ALL-UNNAMED \
    --add-opens=java.base/java.util.concurrent=ALL-UNNAMED \
    --add-opens=java.base/sun.security.provider=ALL-UNNAMED \
    $loader \
    -cp "$cp" \
    dev.thaw.runtime.Bootstrap "$@"
