/* The legacy executor and symbol functions through the public header (and nnvm's names for
 * the symbol functions): MXExecutorBind/BindX, SimpleBind
 * (32-bit shapes) with a shared buffer and shared parameter names, SimpleBindEx64 sharing a
 * first executor's parameters, Reshape (down, refused up, allowed up), the monitor callback,
 * GetOptimizedSymbol, and bad input. The graph: out = FullyConnected(data, num_hidden=2). */
#include <mxnet/c_api.h>

#include "check.h"

#include <stdio.h>
#include <string.h>


static const char *JSON =
    "{\"nodes\": ["
    "{\"op\": \"null\", \"name\": \"data\", \"inputs\": []},"
    "{\"op\": \"null\", \"name\": \"fc_weight\", \"inputs\": []},"
    "{\"op\": \"null\", \"name\": \"fc_bias\", \"inputs\": []},"
    "{\"op\": \"FullyConnected\", \"name\": \"fc\", \"attrs\": {\"num_hidden\": \"2\"},"
    " \"inputs\": [[0, 0, 0], [1, 0, 0], [2, 0, 0]]}],"
    "\"arg_nodes\": [0, 1, 2], \"node_row_ptr\": [0, 1, 2, 3, 4], \"heads\": [[3, 0, 0]],"
    "\"attrs\": {\"mxnet_version\": [\"int\", 10901]}}";


static void fill(NDArrayHandle h, const float *v, size_t n) { CHECK(MXNDArraySyncCopyFromCPU(h, v, n) == 0); }

static void read_into(NDArrayHandle h, float *out, size_t n) { CHECK(MXNDArraySyncCopyToCPU(h, out, n) == 0); }

static void shape_of(NDArrayHandle h, uint32_t *ndim, const uint32_t **dims) {
  CHECK(MXNDArrayGetShape(h, ndim, dims) == 0);
}

/* Outputs of a forward (inference). */
static NDArrayHandle forward_output(ExecutorHandle e) {
  uint32_t n = 0;
  NDArrayHandle *outs = NULL;
  CHECK(MXExecutorForward(e, 0) == 0);
  CHECK(MXExecutorOutputs(e, &n, &outs) == 0);
  CHECK(n == 1);
  return n == 1 ? outs[0] : NULL;
}

static int hook_calls = 0, hook_saw_fc = 0;
static void op_hook(const char *name, const char *opr_name, NDArrayHandle array) {
  hook_calls++;
  if (strcmp(name, "fc_output") == 0 && strcmp(opr_name, "FullyConnected") == 0) hook_saw_fc = 1;
  MXNDArrayFree(array); /* the callee owns the handle */
}

static int monitor_calls = 0;
static int monitor_saw_output = 0;
static void monitor(const char *name, NDArrayHandle array, void *tag) {
  monitor_calls++;
  if (strcmp(name, "fc_output") == 0 && tag == (void *)&monitor_calls) monitor_saw_output = 1;
  MXNDArrayFree(array); /* the callee owns the handle */
}

int main(void) {
  SymbolHandle sym = NULL, opt = NULL;
  ExecutorHandle e1 = NULL, e2 = NULL, small = NULL, big = NULL, bound = NULL;
  const char *shape_names[1] = {"data"};
  const uint32_t shape_data[2] = {4, 3}, shape_idx[2] = {0, 2};
  const int64_t shape_data64[2] = {4, 3};
  const char *shared_args[2] = {"fc_weight", "fc_bias"};
  const char *write_req[1] = {"write"}, *inplace_req[1] = {"inplace"};
  int buffer_len = 0;
  const char **buffer_names = NULL;
  NDArrayHandle *buffer_handles = NULL;
  uint32_t n_args = 0, n_aux = 0, i, ndim = 0, n_sym_args = 0;
  NDArrayHandle *args = NULL, *grads = NULL, *aux = NULL, out;
  const uint32_t *dims = NULL;
  const char **sym_args = NULL;
  const float weight[6] = {1, 0, 0, 0, 1, 1}, bias[2] = {0.5f, -1};
  float data[12], got[8];
  NDArrayHandle w1 = NULL, b1 = NULL;

  for (i = 0; i < 12; i++) data[i] = (float)i;
  CHECK(MXSymbolCreateFromJSON(JSON, &sym) == 0);

  /* SimpleBind with an empty shared buffer and one request for all (the frontend's
   * grad_req='write': no names, one type): the data and its gradient join the buffer. */
  CHECK(MXExecutorSimpleBind(sym, 1, 0, 0, NULL, NULL, NULL, 0, NULL, write_req, 1, shape_names, shape_data, shape_idx, 0,
                             NULL, NULL, 0, NULL, NULL, 2, shared_args, &buffer_len, NULL, NULL, &buffer_names,
                             &buffer_handles, &n_args, &args, &grads, &n_aux, &aux, NULL, &e1) == 0);
  CHECK(n_args == 3 && n_aux == 0);
  CHECK(buffer_len == 2);
  if (buffer_len == 2) {
    CHECK(strcmp(buffer_names[0], "data") == 0 && strcmp(buffer_names[1], "grad of data") == 0);
    for (i = 0; i < 2; i++) CHECK(MXNDArrayFree(buffer_handles[i]) == 0);
  }
  if (n_args == 3) {
    fill(args[0], data, 12);
    fill(args[1], weight, 6);
    fill(args[2], bias, 2);
    w1 = args[1];
    b1 = args[2];
    CHECK(MXNDArrayFree(args[0]) == 0);
    for (i = 0; i < 3; i++) CHECK(grads[i] == NULL || MXNDArrayFree(grads[i]) == 0);
  }
  out = forward_output(e1);
  read_into(out, got, 8);
  /* Row r of data is (3r, 3r+1, 3r+2): outputs 3r + 0.5 and (3r+1)+(3r+2) - 1. */
  CHECK(got[0] == 0.5f && got[1] == 2.0f && got[6] == 9.5f && got[7] == 20.0f);
  CHECK(MXNDArrayFree(out) == 0);

  /* The monitor sees the operator's output under stock's name, with the pointer given. */
  CHECK(MXExecutorSetMonitorCallback(e1, monitor, &monitor_calls) == 0);
  out = forward_output(e1);
  CHECK(MXNDArrayWaitAll() == 0);
  CHECK(monitor_calls == 1 && monitor_saw_output);
  CHECK(MXExecutorSetMonitorCallbackEX(e1, monitor, &monitor_calls, 1) == 0);
  monitor_calls = 0;
  CHECK(MXNDArrayFree(out) == 0);
  out = forward_output(e1);
  /* monitor_all: each input under the operator's name, the three variables under their own,
   * then the output. */
  CHECK(monitor_calls == 7);
  CHECK(MXExecutorSetMonitorCallback(e1, NULL, NULL) == 0);
  CHECK(MXNDArrayFree(out) == 0);

  /* SimpleBindEx64 sharing e1's parameters: the same memory, so a change shows in both. */
  buffer_len = -1;
  CHECK(MXExecutorSimpleBindEx64(sym, 1, 0, 0, NULL, NULL, NULL, 0, NULL, NULL, 1, shape_names, shape_data64,
                                 shape_idx, 0, NULL, NULL, 0, NULL, NULL, 2, shared_args, &buffer_len, NULL, NULL,
                                 &buffer_names, &buffer_handles, &n_args, &args, &grads, &n_aux, &aux, e1, &e2) == 0);
  CHECK(buffer_len == -1); /* no buffer given: none handed back, and nothing is shared */
  CHECK(n_args == 3 && grads[0] == NULL && grads[1] == NULL); /* no requests: no gradients */
  for (i = 0; i < n_args; i++) {
    CHECK(MXNDArrayFree(args[i]) == 0);
    CHECK(grads[i] == NULL || MXNDArrayFree(grads[i]) == 0);
  }
  CHECK(MXExecutorFree(e2) == 0);
  buffer_len = 0;
  CHECK(MXExecutorSimpleBindEx64(sym, 1, 0, 0, NULL, NULL, NULL, 0, NULL, NULL, 1, shape_names, shape_data64,
                                 shape_idx, 0, NULL, NULL, 0, NULL, NULL, 2, shared_args, &buffer_len, NULL, NULL,
                                 &buffer_names, &buffer_handles, &n_args, &args, &grads, &n_aux, &aux, e1, &e2) == 0);
  for (i = 0; i < (uint32_t)buffer_len; i++) CHECK(MXNDArrayFree(buffer_handles[i]) == 0);
  if (n_args == 3) {
    const float bias2[2] = {100, 200};
    fill(b1, bias2, 2); /* through e1's bias */
    fill(args[0], data, 12);
    read_into(args[2], got, 2);
    CHECK(got[0] == 100 && got[1] == 200);
    for (i = 0; i < 3; i++) {
      CHECK(MXNDArrayFree(args[i]) == 0);
      CHECK(grads[i] == NULL || MXNDArrayFree(grads[i]) == 0);
    }
    fill(b1, bias, 2);
  }

  /* simple_bind takes null, write and add (stock refuses inplace there). */
  CHECK(MXExecutorSimpleBindEx64(sym, 1, 0, 0, NULL, NULL, NULL, 0, NULL, inplace_req, 1, shape_names, shape_data64,
                                 shape_idx, 0, NULL, NULL, 0, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL,
                                 &n_args, &args, &grads, &n_aux, &aux, NULL, &big) == -1);
  CHECK(starts_with(MXGetLastError(), "MXNetError: grad_req=inplace is not a valid input in simple_bind"));

  /* Reshape down: a view of the same memory (the first two rows of the data). */
  {
    const uint32_t small_shape[2] = {2, 3}, big_shape[2] = {8, 3};
    CHECK(MXExecutorReshape(0, 0, 1, 0, 0, NULL, NULL, NULL, 1, shape_names, small_shape, shape_idx, &n_args, &args,
                            &grads, &n_aux, &aux, e1, &small) == 0);
    for (i = 0; i < n_args; i++) {
      CHECK(MXNDArrayFree(args[i]) == 0);
      CHECK(grads[i] == NULL || MXNDArrayFree(grads[i]) == 0);
    }
    out = forward_output(small);
    shape_of(out, &ndim, &dims);
    CHECK(ndim == 2 && dims[0] == 2 && dims[1] == 2);
    read_into(out, got, 4);
    CHECK(got[0] == 0.5f && got[1] == 2.0f && got[2] == 3.5f && got[3] == 8.0f);
    CHECK(MXNDArrayFree(out) == 0);
    /* Up: refused without allow_up_sizing, with stock's message; new arrays with it. */
    CHECK(MXExecutorReshape(0, 0, 1, 0, 0, NULL, NULL, NULL, 1, shape_names, big_shape, shape_idx, &n_args, &args,
                            &grads, &n_aux, &aux, e1, &big) == -1);
    CHECK(starts_with(MXGetLastError(), "MXNetError: New shape of arg: data is larger than original"));
    CHECK(MXExecutorReshape(0, 1, 1, 0, 0, NULL, NULL, NULL, 1, shape_names, big_shape, shape_idx, &n_args, &args,
                            &grads, &n_aux, &aux, e1, &big) == 0);
    for (i = 0; i < n_args; i++) {
      CHECK(MXNDArrayFree(args[i]) == 0);
      CHECK(grads[i] == NULL || MXNDArrayFree(grads[i]) == 0);
    }
    out = forward_output(big);
    shape_of(out, &ndim, &dims);
    CHECK(ndim == 2 && dims[0] == 8 && dims[1] == 2);
    CHECK(MXNDArrayFree(out) == 0);
  }

  /* Bind with caller's arrays: MXExecutorBind (and BindX without maps) give e1's results. */
  {
    NDArrayHandle ins[3], outh;
    uint32_t grad_req[3] = {0, 0, 0};
    const uint32_t s_data[2] = {4, 3};
    CHECK(MXNDArrayCreateEx(s_data, 2, 1, 0, 0, 0, &ins[0]) == 0);
    fill(ins[0], data, 12);
    ins[1] = w1;
    ins[2] = b1;
    CHECK(MXExecutorBind(sym, 1, 0, 3, ins, NULL, grad_req, 0, NULL, &bound) == 0);
    outh = forward_output(bound);
    read_into(outh, got, 8);
    CHECK(got[0] == 0.5f && got[7] == 20.0f);
    CHECK(MXNDArrayFree(outh) == 0);
    CHECK(MXExecutorFree(bound) == 0);
    CHECK(MXExecutorBindX(sym, 1, 0, 0, NULL, NULL, NULL, 3, ins, NULL, grad_req, 0, NULL, &bound) == 0);
    CHECK(MXExecutorFree(bound) == 0);
    /* Two arrays for three arguments. */
    CHECK(MXExecutorBind(sym, 1, 0, 2, ins, NULL, grad_req, 0, NULL, &bound) == -1);
    CHECK(starts_with(MXGetLastError(), "ValueError: "));
    CHECK(MXNDArrayFree(ins[0]) == 0);
  }

  /* A CachedOp (MXCreateCachedOpEX) with an operator hook: the output, then with monitor_all
   * the three inputs first (a CachedOp does not report variables under their own names). */
  {
    CachedOpHandle cop = NULL;
    NDArrayHandle ins[3], *outs = NULL;
    int n_out = 0;
    const uint32_t s_data[2] = {4, 3};
    CHECK(MXCreateCachedOpEX(sym, 0, NULL, NULL, &cop, 0) == 0);
    CHECK(MXCachedOpRegisterOpHook(cop, op_hook, 0) == 0);
    CHECK(MXNDArrayCreateEx(s_data, 2, 1, 0, 0, 0, &ins[0]) == 0);
    fill(ins[0], data, 12);
    ins[1] = w1;
    ins[2] = b1;
    CHECK(MXInvokeCachedOp(cop, 3, ins, &n_out, &outs) == 0 && n_out == 1);
    CHECK(hook_calls == 1 && hook_saw_fc);
    if (n_out == 1) {
      read_into(outs[0], got, 8);
      CHECK(got[0] == 0.5f && got[7] == 20.0f);
      CHECK(MXNDArrayFree(outs[0]) == 0);
    }
    CHECK(MXCachedOpRegisterOpHook(cop, op_hook, 1) == 0);
    hook_calls = 0;
    n_out = 0; /* the library allocates the outputs again */
    outs = NULL;
    CHECK(MXInvokeCachedOp(cop, 3, ins, &n_out, &outs) == 0 && n_out == 1);
    CHECK(hook_calls == 4);
    if (n_out == 1) CHECK(MXNDArrayFree(outs[0]) == 0);
    CHECK(MXCachedOpRegisterOpHook(cop, NULL, 0) == 0);
    CHECK(MXCachedOpRegisterOpHook((CachedOpHandle)(uintptr_t)0x1234, op_hook, 0) == -1);
    CHECK(MXFreeCachedOp(cop) == 0);
    CHECK(MXNDArrayFree(ins[0]) == 0);
  }

  /* The executor's symbol. */
  CHECK(MXExecutorGetOptimizedSymbol(e1, &opt) == 0);
  CHECK(MXSymbolListArguments(opt, &n_sym_args, &sym_args) == 0);
  CHECK(n_sym_args == 3 && strcmp(sym_args[1], "fc_weight") == 0);
  CHECK(MXSymbolFree(opt) == 0);

  /* The symbol functions the legacy frontends call: 32-bit shape inference, input symbols,
   * shallow copies; MXSymbolGrad fails as stock's does; no subgraph to cut here. */
  {
    const char *keys[1] = {"data"};
    const uint32_t ind[2] = {0, 2}, dat[2] = {4, 3};
    uint32_t in_n = 0, out_n = 0, aux_n = 0;
    const uint32_t *in_nd = NULL, *out_nd = NULL, *aux_nd = NULL, **in_d = NULL, **out_d = NULL, **aux_d = NULL;
    int complete = 0, n_inputs = 0;
    SymbolHandle *inputs = NULL, copy = NULL, grad = NULL;
    const char *name = NULL;
    int ok = 0;
    CHECK(MXSymbolInferShape(sym, 1, keys, ind, dat, &in_n, &in_nd, &in_d, &out_n, &out_nd, &out_d, &aux_n, &aux_nd,
                             &aux_d, &complete) == 0);
    CHECK(complete == 1 && in_n == 3 && out_n == 1 && aux_n == 0);
    if (in_n == 3 && out_n == 1) {
      CHECK(in_nd[1] == 2 && in_d[1][0] == 2 && in_d[1][1] == 3); /* fc_weight (2, 3) */
      CHECK(out_nd[0] == 2 && out_d[0][0] == 4 && out_d[0][1] == 2);
    }
    CHECK(MXSymbolInferShapePartial(sym, 0, NULL, ind, dat, &in_n, &in_nd, &in_d, &out_n, &out_nd, &out_d, &aux_n,
                                    &aux_nd, &aux_d, &complete) == 0);
    CHECK(complete == 1 && in_n == 3 && in_nd[0] == 0); /* nothing given: unknown, ndim 0 */
    CHECK(MXSymbolGetInputSymbols(sym, &inputs, &n_inputs) == 0);
    CHECK(n_inputs == 3);
    for (i = 0; i < (uint32_t)n_inputs; i++) {
      CHECK(MXSymbolGetName(inputs[i], &name, &ok) == 0 && ok);
      if (i == 2) CHECK(strcmp(name, "fc_bias") == 0);
      CHECK(MXSymbolFree(inputs[i]) == 0);
    }
    CHECK(MXShallowCopySymbol(sym, &copy) == 0);
    CHECK(MXSymbolListArguments(copy, &n_sym_args, &sym_args) == 0 && n_sym_args == 3);
    CHECK(MXSymbolFree(copy) == 0);
    CHECK(MXSymbolGrad(sym, 1, keys, &grad) == -1);
    CHECK(starts_with(MXGetLastError(), "NotImplementedError: MXSymbolGrad"));
    CHECK(MXSymbolCutSubgraph(sym, &inputs, &n_inputs) == 0 && n_inputs == 0);
  }

  /* nnvm's names for the symbol functions, its error slot, and its graph IR (refused). */
  {
    SymbolHandle v = NULL, fc = NULL, *vars = NULL, internals = NULL, copy = NULL;
    OpHandle op = NULL, *ops = NULL;
    uint32_t n = 0, n_ops = 0;
    const char *keys[1] = {"num_hidden"}, *vals[1] = {"2"}, *akeys[2] = {"lr_mult", "wd_mult"},
               *avals[2] = {"2", "0"}, *got_attr = NULL, **names = NULL;
    int ok = 0;
    void *graph = NULL;
    CHECK(NNListUniqueOps(&n_ops, &ops) == 0 && n_ops > 100);
    CHECK(NNGetOpHandle("FullyConnected", &op) == 0);
    CHECK(NNSymbolCreateVariable("x", &v) == 0);
    CHECK(NNSymbolCreateAtomicSymbol(op, 1, keys, vals, &fc) == 0);
    CHECK(NNSymbolCompose(fc, "f", 1, NULL, &v) == 0);
    CHECK(NNSymbolListInputVariables(fc, 1, &n, &vars) == 0 && n == 3);
    for (i = 0; i < n; i++) CHECK(NNSymbolFree(vars[i]) == 0);
    CHECK(NNSymbolListOutputNames(fc, &n, &names) == 0 && n == 1 && strcmp(names[0], "f_output") == 0);
    CHECK(NNSymbolGetNumOutputs(fc, &n) == 0 && n == 1);
    CHECK(NNSymbolSetAttrs(fc, 2, akeys, avals) == 0);
    CHECK(NNSymbolGetAttr(fc, "wd_mult", &got_attr, &ok) == 0 && ok && strcmp(got_attr, "0") == 0);
    CHECK(NNSymbolListAttrs(fc, 1, &n, &names) == 0 && n >= 3);
    CHECK(NNSymbolListAttrs(fc, 7, &n, &names) == -1);
    CHECK(NNSymbolGetInternals(fc, &internals) == 0);
    CHECK(NNSymbolGetNumOutputs(internals, &n) == 0 && n == 4);
    CHECK(NNSymbolCopy(fc, &copy) == 0);
    CHECK(NNAddControlDeps(fc, copy) == -1 && starts_with(NNGetLastError(), "NotImplementedError: "));
    CHECK(NNGraphCreate(fc, &graph) == -1 && starts_with(NNGetLastError(), "NotImplementedError: NNGraphCreate"));
    NNAPISetLastError("frontend: something failed");
    CHECK(strcmp(MXGetLastError(), "frontend: something failed") == 0);
    CHECK(NNSymbolFree(copy) == 0 && NNSymbolFree(internals) == 0);
    CHECK(NNSymbolFree(fc) == 0 && NNSymbolFree(v) == 0);
  }

  /* Bad handles. */
  CHECK(MXExecutorSetMonitorCallback((ExecutorHandle)(uintptr_t)0x1234, monitor, NULL) == -1);
  CHECK(MXExecutorReshape(0, 0, 1, 0, 0, NULL, NULL, NULL, 1, shape_names, shape_data, shape_idx, &n_args, &args,
                          &grads, &n_aux, &aux, NULL, &big) == -1);

  CHECK(MXNDArrayFree(w1) == 0);
  CHECK(MXNDArrayFree(b1) == 0);
  CHECK(MXExecutorFree(small) == 0);
  CHECK(MXExecutorFree(big) == 0);
  CHECK(MXExecutorFree(e2) == 0);
  CHECK(MXExecutorFree(e1) == 0);
  CHECK(MXSymbolFree(sym) == 0);
  if (failures) {
    fprintf(stderr, "executor: %d check(s) failed\n", failures);
    return 1;
  }
  printf("executor: all checks passed\n");
  return 0;
}
