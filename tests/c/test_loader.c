/* The header-only loader. `test_loader ok`: MXNET_LIBRARY_PATH names the library; it loads
 * and MXGetVersion answers. `test_loader fail TEXT`: loading fails and the error contains TEXT
 * and the path from MXNET_LIBRARY_PATH. */
#include <mxnet/mxnet_loader.h>

int main(int argc, char **argv) {
  mxnet_loader l;
  int (*get_version)(int *) = NULL;
  int (*missing)(void) = NULL;
  int version = 0;
  const char *env = getenv("MXNET_LIBRARY_PATH");
  if (argc >= 2 && strcmp(argv[1], "ok") == 0) {
    if (mxnet_loader_open(&l, NULL) != 0) {
      fprintf(stderr, "unexpected failure: %s\n", l.error);
      return 1;
    }
    if (mxnet_loader_sym(&l, "MXGetVersion", (void **)&get_version) != 0 ||
        get_version(&version) != 0 || version != 10901) {
      fprintf(stderr, "MXGetVersion through the loader failed: %s\n", l.error);
      return 1;
    }
    if (mxnet_loader_sym(&l, "MXNoSuchFunction", (void **)&missing) == 0 ||
        strstr(l.error, "MXNoSuchFunction") == NULL || strstr(l.error, l.path) == NULL) {
      fprintf(stderr, "missing symbol not reported: %s\n", l.error);
      return 1;
    }
    mxnet_loader_close(&l);
    printf("loaded %s, version %d\n", l.path, version);
    return 0;
  }
  if (argc >= 3 && strcmp(argv[1], "fail") == 0) {
    if (mxnet_loader_open(&l, NULL) == 0) {
      fprintf(stderr, "expected a failure for %s\n", env ? env : "(unset)");
      return 1;
    }
    printf("error: %s\n", l.error);
    if (strstr(l.error, argv[2]) == NULL || env == NULL || strstr(l.error, env) == NULL) {
      fprintf(stderr, "error does not name '%s' and the path\n", argv[2]);
      return 1;
    }
    mxnet_loader_close(&l);
    return 0;
  }
  fprintf(stderr, "usage: test_loader ok | fail TEXT\n");
  return 2;
}
