/* The C tests' shared check: a failed condition is reported with its place and the library's
 * last error, and counted in `failures`, which each test's main() turns into its exit status.
 * Include after <mxnet/c_api.h>. */
#ifndef MXNET_RT_TESTS_CHECK_H_
#define MXNET_RT_TESTS_CHECK_H_

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                       \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "%s:%d: check failed: %s\n  last error: %s\n", __FILE__, __LINE__,  \
              #cond, MXGetLastError());                                                   \
      failures++;                                                                         \
    }                                                                                     \
  } while (0)

/* Whether `s` (which may be NULL) begins with `prefix`. */
static inline int starts_with(const char *s, const char *prefix) {
  return s != NULL && strncmp(s, prefix, strlen(prefix)) == 0;
}

#endif /* MXNET_RT_TESTS_CHECK_H_ */
