/*
 * mxnet-rt: header-only loader for libmxnet.so (POSIX dlopen), for programs that pick the
 * library at run time instead of linking it, in the style of the Python frontend's
 * MXNET_LIBRARY_PATH.
 *
 *   mxnet_loader l;
 *   if (mxnet_loader_open(&l, NULL) != 0) { fprintf(stderr, "%s\n", l.error); return 1; }
 *   int (*get_version)(int*);
 *   if (mxnet_loader_sym(&l, "MXGetVersion", (void**)&get_version) != 0) { ... l.error ... }
 *   mxnet_loader_close(&l);
 *
 * Search order: the environment variable MXNET_LIBRARY_PATH, which must be the absolute path
 * of the library file and is then the only candidate; else `fallback_path` when not NULL;
 * else "libmxnet.so" through the dynamic linker's search (LD_LIBRARY_PATH, rpath, ld.so.cache).
 * On failure `error` names the path and why it failed.
 * Link with -ldl on glibc older than 2.34.
 */
#ifndef MXNET_RT_LOADER_H_
#define MXNET_RT_LOADER_H_

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mxnet_loader {
  void *handle;      /* dlopen handle, NULL when not open */
  char path[4096];   /* the path that was opened (or last tried) */
  char error[1024];  /* what went wrong, when a call returned -1 */
} mxnet_loader;

/* Open the library. Returns 0 on success, -1 with `l->error` set. */
static inline int mxnet_loader_open(mxnet_loader *l, const char *fallback_path) {
  const char *env = getenv("MXNET_LIBRARY_PATH");
  const char *path;
  struct stat st;
  memset(l, 0, sizeof(*l));
  if (env != NULL) {
    snprintf(l->path, sizeof(l->path), "%s", env);
    if (env[0] != '/') {
      snprintf(l->error, sizeof(l->error),
               "MXNET_LIBRARY_PATH=%.900s: not an absolute path to the library file", env);
      return -1;
    }
    if (stat(env, &st) != 0 || !S_ISREG(st.st_mode)) {
      snprintf(l->error, sizeof(l->error), "MXNET_LIBRARY_PATH=%.900s: no such file", env);
      return -1;
    }
    path = env;
  } else if (fallback_path != NULL) {
    path = fallback_path;
  } else {
    path = "libmxnet.so";
  }
  snprintf(l->path, sizeof(l->path), "%s", path);
  l->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (l->handle == NULL) {
    const char *why = dlerror();
    snprintf(l->error, sizeof(l->error), "%s%.500s: cannot load: %.400s",
             env != NULL ? "MXNET_LIBRARY_PATH=" : "", path, why != NULL ? why : "unknown error");
    return -1;
  }
  return 0;
}

/* Look up `name` and store it in `*out` (a function pointer passed as void**).
 * Returns 0 on success, -1 with `l->error` naming the symbol and the library. */
static inline int mxnet_loader_sym(mxnet_loader *l, const char *name, void **out) {
  void *sym;
  if (l->handle == NULL) {
    snprintf(l->error, sizeof(l->error), "%.200s: library is not open", name);
    return -1;
  }
  dlerror();
  sym = dlsym(l->handle, name);
  if (sym == NULL) {
    snprintf(l->error, sizeof(l->error), "%.200s: symbol not found in %.800s", name, l->path);
    return -1;
  }
  *out = sym;
  return 0;
}

/* Close the library (safe to call on a loader that failed to open). */
static inline void mxnet_loader_close(mxnet_loader *l) {
  if (l->handle != NULL) {
    dlclose(l->handle);
    l->handle = NULL;
  }
}

#ifdef __cplusplus
}
#endif

#endif /* MXNET_RT_LOADER_H_ */
