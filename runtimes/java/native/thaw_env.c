/*
 * The process environment of the Java runtime, changed from the shim (JNI).
 *
 * A base JVM starts before its function is known; the `load` frame then brings the
 * function's environment. Java can change its own view of it (System.getenv, through
 * reflection: Env.java) but not the C library's `environ`, which child processes
 * inherit (ProcessBuilder passes no environment of its own unless asked), and the JDK
 * has no API for setenv(3) (its foreign-function API is an incubator in 17, which
 * prints a warning on every start). Hence these two functions, by hand: setenv, and
 * chdir, which Java has no API for either (a base instance repurposed for a function
 * keeps a working directory on the /var/task that the function's code replaced).
 *
 * Built by scripts/build-runtimes.sh into build/runtimes/java/libthawenv.so.
 */
#include <jni.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A NUL-terminated copy of a Java byte array (UTF-8), or NULL. */
static char *cstring(JNIEnv *env, jbyteArray bytes) {
    jsize n = (*env)->GetArrayLength(env, bytes);
    char *s = malloc((size_t)n + 1);
    if (s == NULL) {
        return NULL;
    }
    (*env)->GetByteArrayRegion(env, bytes, 0, n, (jbyte *)s);
    s[n] = '\0';
    return memchr(s, '\0', (size_t)n) == NULL ? s : (free(s), NULL);
}

/* setenv(key, value, 1), or unsetenv(key) when value is null: 0, or -1 on failure. */
JNIEXPORT jint JNICALL Java_dev_thaw_runtime_Env_setenv0(JNIEnv *env, jclass cls, jbyteArray key, jbyteArray value) {
    (void)cls;
    char *k = cstring(env, key);
    if (k == NULL) {
        return -1;
    }
    int r;
    if (value == NULL) {
        r = unsetenv(k);
    } else {
        char *v = cstring(env, value);
        r = v == NULL ? -1 : setenv(k, v, 1);
        free(v);
    }
    free(k);
    return r;
}

/* chdir(path): 0, or -1 on failure. */
JNIEXPORT jint JNICALL Java_dev_thaw_runtime_Env_chdir0(JNIEnv *env, jclass cls, jbyteArray path) {
    (void)cls;
    char *p = cstring(env, path);
    if (p == NULL) {
        return -1;
    }
    int r = chdir(p);
    free(p);
    return r;
}
