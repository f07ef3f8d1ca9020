/* The C API through the public header: return conventions, MXGetLastError, configuration
 * (strict parsing, precedence, read-once), library information, panic containment.
 * Started with MXNET_GPU_WORKER_NTHREAD=3 (typo), MXNET_CPU_PRIORITY_NTHREADS=lots (bad value)
 * and MXNET_EXEC_NUM_TEMP=4 in the environment (see CMakeLists.txt). */
#include <mxnet/c_api.h>

#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Internal test entry points, exported but not in the public header. */
int MXRtTestPanic(int how);
int MXRtTestUseConfig(const char *name, const char **out_json);



static int contains(const char *s, const char *needle) {
  return s != NULL && strstr(s, needle) != NULL;
}

static void library_info(void) {
  int version = 0, count = -1, threads = 0;
  const struct LibFeature *features = NULL, *again = NULL;
  size_t n = 0, i;
  int seen_tvm = 0, seen_int64 = 0;
  uint64_t free_mem = 0, total_mem = 0;

  CHECK(MXGetVersion(NULL) == -1);
  CHECK(starts_with(MXGetLastError(), "ValueError: out must not be NULL"));
  CHECK(MXGetVersion(&version) == 0 && version == 10901);

  /* CUDA is found at run time: on exactly where the machine has a GPU (none in CI). */
  CHECK(MXGetGPUCount(&count) == 0 && count >= 0);
  CHECK(MXLibInfoFeatures(&features, &n) == 0 && n == 32);
  CHECK(MXLibInfoFeatures(&again, &n) == 0 && again == features); /* static lifetime */
  for (i = 0; i < n; i++) {
    if (strcmp(features[i].name, "TVM_OP") == 0) seen_tvm = !features[i].enabled;
    if (strcmp(features[i].name, "INT64_TENSOR_SIZE") == 0) seen_int64 = !features[i].enabled;
    if (strcmp(features[i].name, "CUDA") == 0) CHECK(features[i].enabled == (count > 0));
  }
  CHECK(seen_tvm && seen_int64);

  CHECK(MXGetGPUMemoryInformation64(count, &free_mem, &total_mem) == -1);
  CHECK(starts_with(MXGetLastError(), "MXNetError: gpu("));
  CHECK(strstr(MXGetLastError(), ") is not available") != NULL);

  CHECK(MXSetNumOMPThreads(0) == -1);
  CHECK(starts_with(MXGetLastError(), "ValueError:"));
  CHECK(MXSetNumOMPThreads(3) == 0);
  CHECK(MXGetNumOMPThreads(&threads) == 0 && threads == 3);
}

static void environment(void) {
  const char *value = (const char *)1;
  const char *json = NULL;

  CHECK(MXGetEnv("MXRT_TEST_UNSET_VARIABLE", &value) == 0 && value == NULL);
  CHECK(MXSetEnv("MXRT_TEST_VARIABLE", "abc") == 0);
  CHECK(MXGetEnv("MXRT_TEST_VARIABLE", &value) == 0 && value != NULL && strcmp(value, "abc") == 0);
  CHECK(getenv("MXRT_TEST_VARIABLE") != NULL); /* the live process environment */
  CHECK(MXSetEnv("MXRT_TEST_VARIABLE", NULL) == 0);
  CHECK(getenv("MXRT_TEST_VARIABLE") == NULL);
  CHECK(MXSetEnv(NULL, "x") == -1 && starts_with(MXGetLastError(), "ValueError: name must not be NULL"));
  CHECK(MXGetEnv("X", NULL) == -1);

  /* Strict validation: the value, the variable and what is accepted are named; nothing changes. */
  CHECK(MXSetEnv("MXNET_CPU_WORKER_NTHREADS", "-1") == -1);
  CHECK(starts_with(MXGetLastError(), "ValueError: environment variable MXNET_CPU_WORKER_NTHREADS=\"-1\""));
  CHECK(contains(MXGetLastError(), "an integer in [1, 1024]"));
  CHECK(getenv("MXNET_CPU_WORKER_NTHREADS") == NULL);
  CHECK(MXSetEnv("MXNET_ENGINE_TYPE", "NativeEngine") == -1);
  CHECK(contains(MXGetLastError(), "did you mean NaiveEngine?"));

  /* A bad value from the process environment is reported, and fails its first use. */
  CHECK(MXGetConfig("MXNET_CPU_PRIORITY_NTHREADS", &json) == 0);
  CHECK(contains(json, "\"valid\":false") && contains(json, "\"source\":\"environment\""));
  CHECK(MXRtTestUseConfig("MXNET_CPU_PRIORITY_NTHREADS", &json) == -1);
  CHECK(contains(MXGetLastError(), "MXNET_CPU_PRIORITY_NTHREADS=\"lots\""));

  /* Precedence: environment, then MXSetEnv; dynamic variables follow at the next use. */
  CHECK(MXRtTestUseConfig("MXNET_EXEC_NUM_TEMP", &json) == 0);
  CHECK(contains(json, "\"value\":4") && contains(json, "\"source\":\"environment\""));
  CHECK(MXSetEnv("MXNET_EXEC_NUM_TEMP", "6") == 0);
  CHECK(MXRtTestUseConfig("MXNET_EXEC_NUM_TEMP", &json) == 0);
  CHECK(contains(json, "\"value\":6") && contains(json, "\"source\":\"MXSetEnv\""));
  CHECK(MXGetConfig("MXNET_EXEC_NUM_TEMP", &json) == 0 && contains(json, "\"read_once\":false"));

  /* Read once: the first use fixes the value; MXSetEnv then fails and says when it was fixed. */
  CHECK(MXGetConfig("MXNET_ENGINE_TYPE", &json) == 0 && contains(json, "\"already_read\":false"));
  CHECK(MXRtTestUseConfig("MXNET_ENGINE_TYPE", &json) == 0);
  CHECK(contains(json, "\"value\":\"ThreadedEnginePerDevice\"") && contains(json, "\"source\":\"default\""));
  CHECK(MXSetEnv("MXNET_ENGINE_TYPE", "NaiveEngine") == -1);
  CHECK(contains(MXGetLastError(), "read once") && contains(MXGetLastError(), "MXRtTestUseConfig"));
  CHECK(MXGetConfig("MXNET_ENGINE_TYPE", &json) == 0 && contains(json, "\"already_read\":true"));

  /* The whole registry, and unknown names. */
  CHECK(MXGetConfig(NULL, &json) == 0 && json[0] == '[' && contains(json, "NNVM_EXEC_MATCH_RANGE"));
  CHECK(MXGetConfig("MXNET_GPU_WORKER_NTHREAD", &json) == -1);
  CHECK(contains(MXGetLastError(), "did you mean MXNET_GPU_WORKER_NTHREADS?"));
}

static void panics_are_contained(void) {
  int how, version = 0;
  for (how = 0; how < 3; how++) {
    CHECK(MXRtTestPanic(how) == -1);
    CHECK(starts_with(MXGetLastError(), "InternalError: panic in MXRtTestPanic"));
  }
  CHECK(MXRtTestPanic(9) == -1 && starts_with(MXGetLastError(), "MXNetError: deliberate test error"));
  CHECK(MXGetVersion(&version) == 0 && version == 10901); /* still working */
}

static void shutdown_is_idempotent(void) {
  int version = 0;
  CHECK(MXNotifyShutdown() == 0);
  CHECK(MXNotifyShutdown() == 0);
  CHECK(MXGetVersion(&version) == 0 && version == 10901);
}

int main(void) {
  library_info();
  environment();
  panics_are_contained();
  shutdown_is_idempotent();
  if (failures != 0) {
    fprintf(stderr, "c_api: %d checks failed\n", failures);
    return 1;
  }
  printf("c_api: all checks passed\n");
  return 0;
}
