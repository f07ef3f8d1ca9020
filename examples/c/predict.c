/*
 * Classify an input with a model exported by Gluon (HybridBlock.export writes
 * NAME-symbol.json and NAME-0000.params), through MXNet's Predict API (c_predict_api.h).
 *
 *   predict_c NAME-symbol.json NAME-0000.params SHAPE [INPUT] [OUTPUT]
 *
 * SHAPE is the input's shape, e.g. 1,3,224,224. INPUT is a file of float32 values of that
 * shape (without it, a fixed synthetic image is used); OUTPUT, when given, receives the
 * output as float32 values. Prints the output's shape and its five largest entries.
 */
#include <mxnet/c_predict_api.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                        \
  do {                                                                     \
    if ((call) != 0) {                                                     \
      fprintf(stderr, "%s failed: %s\n", #call, MXGetLastError());         \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

/* The whole file in a new buffer; its size in *size. */
static char *read_file(const char *path, long *size) {
  FILE *f = fopen(path, "rb");
  char *buf;
  if (!f) {
    perror(path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)*size + 1);
  if (!buf || fread(buf, 1, (size_t)*size, f) != (size_t)*size) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  buf[*size] = '\0';
  fclose(f);
  return buf;
}

int main(int argc, char **argv) {
  long json_size, param_size;
  char *json, *params;
  uint32_t shape[8], indptr[2] = {0, 0}, *out_shape, out_ndim, i, k;
  const char *keys[1] = {"data"};
  size_t in_size = 1, out_size = 1;
  float *input, *output;
  PredictorHandle pred;
  char *p;

  if (argc < 4) {
    fprintf(stderr, "usage: %s SYMBOL.json PARAMS SHAPE [INPUT] [OUTPUT]\n", argv[0]);
    return 2;
  }
  json = read_file(argv[1], &json_size);
  params = read_file(argv[2], &param_size);
  for (p = argv[3]; *p && indptr[1] < 8; ++indptr[1]) {
    shape[indptr[1]] = (uint32_t)strtoul(p, &p, 10);
    in_size *= shape[indptr[1]];
    if (*p == ',') ++p;
  }

  CHECK(MXPredCreate(json, params, (int)param_size, 1, 0, 1, keys, indptr, shape, &pred));

  input = malloc(in_size * sizeof(float));
  if (argc > 4) {
    long n;
    char *raw = read_file(argv[4], &n);
    if ((size_t)n != in_size * sizeof(float)) {
      fprintf(stderr, "%s holds %ld bytes, the shape needs %zu\n", argv[4], n, in_size * sizeof(float));
      return 1;
    }
    memcpy(input, raw, in_size * sizeof(float));
    free(raw);
  } else {
    for (i = 0; i < in_size; ++i) input[i] = (float)sin(0.01 * i);
  }
  CHECK(MXPredSetInput(pred, "data", input, (uint32_t)in_size));
  CHECK(MXPredForward(pred));

  CHECK(MXPredGetOutputShape(pred, 0, &out_shape, &out_ndim));
  printf("output shape:");
  for (i = 0; i < out_ndim; ++i) {
    printf(" %u", out_shape[i]);
    out_size *= out_shape[i];
  }
  printf("\n");
  output = malloc(out_size * sizeof(float));
  CHECK(MXPredGetOutput(pred, 0, output, (uint32_t)out_size));

  /* The five largest entries of the first row. */
  {
    size_t row = out_size / (out_ndim ? out_shape[0] : 1);
    int taken[5] = {-1, -1, -1, -1, -1};
    for (k = 0; k < 5 && k < row; ++k) {
      int best = -1;
      size_t j;
      for (j = 0; j < row; ++j) {
        int used = 0, t;
        for (t = 0; t < (int)k; ++t) used |= taken[t] == (int)j;
        if (!used && (best < 0 || output[j] > output[best])) best = (int)j;
      }
      taken[k] = best;
      printf("top %u: class %d, score %.6f\n", k + 1, best, output[best]);
    }
  }

  if (argc > 5) {
    FILE *f = fopen(argv[5], "wb");
    if (!f || fwrite(output, sizeof(float), out_size, f) != out_size) {
      perror(argv[5]);
      return 1;
    }
    fclose(f);
  }
  CHECK(MXPredFree(pred));
  free(output);
  free(input);
  free(params);
  free(json);
  return 0;
}
