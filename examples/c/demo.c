/* mxnet-rt from C: library information, configuration, and error handling.
 * Build: see CMakeLists.txt (find_package(MXNet CONFIG) -> MXNet::mxnet). */
#include <mxnet/c_api.h>

#include <stdio.h>
#include <string.h>

#ifndef DEMO_NAME
#define DEMO_NAME "demo_c"
#endif

/* An engine operation: adds one to the counter it is given. */
static void increment(void *run_context, void *param) {
  (void)run_context;
  *(long *)param += 1;
}

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

  /* The engine: 1000 operations that each write one NDArray run in push order, on a worker
   * thread; the program waits for them, then copies the array's data back. */
  {
    NDArrayHandle arr = NULL;
    uint32_t shape[1] = {4};
    float data[4] = {1.5f, 2.5f, 3.5f, 4.5f}, back[4] = {0};
    const int cpu[2] = {1, 0};
    long counter = 0;
    int k;
    CALL(MXNDArrayCreateEx(shape, 1, 1, 0, 0, 0, &arr));
    CALL(MXNDArraySyncCopyFromCPU(arr, data, 4));
    for (k = 0; k < 1000; k++) {
      CALL(MXEnginePushSyncND(increment, &counter, NULL, cpu, NULL, 0, &arr, 1, NULL, 0, "increment"));
    }
    CALL(MXNDArrayWaitToRead(arr));
    CALL(MXNDArraySyncCopyToCPU(arr, back, 4));
    printf("engine: %ld operations ran in order; array data [%g %g %g %g]\n", counter, back[0],
           back[1], back[2], back[3]);
    CALL(MXNDArrayFree(arr));
    if (counter != 1000) return 1;
  }

  CALL(MXNotifyShutdown());
  printf("%s: ok\n", DEMO_NAME);
  return 0;
}
