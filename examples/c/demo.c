/* mxnet-rt from C: library information, configuration, and error handling.
 * Build: see CMakeLists.txt (find_package(MXNet CONFIG) -> MXNet::mxnet). */
#include <mxnet/c_api.h>

#include <stdio.h>
#include <string.h>

#ifndef DEMO_NAME
#define DEMO_NAME "demo_c"
#endif

/* Print the error and fail when an API call returns -1. */
#define CALL(expr)                                                      \
  do {                                                                  \
    if ((expr) != 0) {                                                  \
      fprintf(stderr, "%s failed: %s\n", #expr, MXGetLastError());      \
      return 1;                                                         \
    }                                                                   \
  } while (0)

int main(void) {
  int version = 0, gpus = -1;
  const struct LibFeature *features = NULL;
  size_t n = 0, i;
  const char *json = NULL;

  CALL(MXGetVersion(&version));
  printf("libmxnet ABI version %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);

  CALL(MXLibInfoFeatures(&features, &n));
  printf("enabled features:");
  for (i = 0; i < n; i++) {
    if (features[i].enabled) printf(" %s", features[i].name);
  }
  printf("\n");

  CALL(MXGetGPUCount(&gpus));
  printf("GPUs: %d\n", gpus);

  /* Configuration: one variable as JSON, then a change through MXSetEnv. */
  CALL(MXGetConfig("MXNET_ENGINE_TYPE", &json));
  printf("MXNET_ENGINE_TYPE: %s\n", json);
  CALL(MXSetEnv("MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN", "30"));
  CALL(MXGetConfig("MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN", &json));
  printf("after MXSetEnv: %s\n", json);

  /* A bad value is refused with a message naming the variable and what it accepts. */
  if (MXSetEnv("MXNET_ENGINE_TYPE", "NativeEngine") != 0) {
    printf("refused as expected: %s\n", MXGetLastError());
  } else {
    fprintf(stderr, "a bad value was accepted\n");
    return 1;
  }

  CALL(MXNotifyShutdown());
  printf("%s: ok\n", DEMO_NAME);
  return 0;
}
