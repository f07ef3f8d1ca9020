/*
 * mxnet-rt: MXNet 1.9.1's deployment header include/mxnet/c_predict_api.h.
 * The Predict API (MXPredCreate, MXPredCreateEx, MXPredCreatePartialOut,
 * MXPredCreateMultiThread, MXPredReshape, MXPredGetOutputShape, MXPredGetOutputType,
 * MXPredSetInput, MXPredForward, MXPredPartialForward, MXPredGetOutput,
 * MXPredSetMonitorCallback, MXPredFree) and its NDArray lists (MXNDListCreate, MXNDListGet,
 * MXNDListFree) are declared, with their documentation, in the generated <mxnet/c_api.h>
 * together with the rest of the ABI; this header includes it.
 */
#ifndef MXNET_RT_C_PREDICT_API_H_
#define MXNET_RT_C_PREDICT_API_H_
#include "c_api.h"
#endif /* MXNET_RT_C_PREDICT_API_H_ */
