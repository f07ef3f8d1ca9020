/*
 * mxnet-rt: compatibility shim for code written against MXNet 1.9.1's
 * include/mxnet/c_api_test.h. MXGetEnv and MXSetEnv are declared in <mxnet/c_api.h>;
 * the subgraph test functions of the stock header are not provided.
 */
#ifndef MXNET_RT_C_API_TEST_H_
#define MXNET_RT_C_API_TEST_H_
#include "c_api.h"
#endif /* MXNET_RT_C_API_TEST_H_ */
