"""GPU inference of a multilayer perceptron: mxnet-rt (the stock 1.9.1 frontend, a hybridized
Gluon net on gpu(0)) against PyTorch eager on the same GPU, in one process, rounds
alternating, medians reported. Runs only where a GPU and PyTorch are present (the device
machine; see scripts/gpu_check.sh); prints one table.

The network (three Dense layers of 1024 units, ReLU, float32) uses only operators that have
GPU forms today; convolutions have none yet, so no model-zoo network is timed here.

Usage: MXNET_LIBRARY_PATH=... python3 bench/gpu_bench.py [rounds]
"""
import statistics
import sys
import time

import numpy as np

import mxnet as mx
import torch

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
ITERS = 50
HIDDEN, IN, OUT = 1024, 1024, 1000


def mx_net():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(HIDDEN, activation="relu", in_units=IN),
            mx.gluon.nn.Dense(HIDDEN, activation="relu", in_units=HIDDEN),
            mx.gluon.nn.Dense(OUT, in_units=HIDDEN))
    net.initialize(mx.init.Xavier(), ctx=mx.gpu(0))
    net.hybridize()
    return net


def torch_net(mnet):
    tn = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                             torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)).cuda().eval()
    # The same weights, so that both compute the same function.
    dense = [b for b in mnet._children.values()]
    with torch.no_grad():
        for lin, d in zip([tn[0], tn[2], tn[4]], dense):
            lin.weight.copy_(torch.from_numpy(d.weight.data().asnumpy()))
            lin.bias.copy_(torch.from_numpy(d.bias.data().asnumpy()))
    return tn


def time_mx(net, x):
    for _ in range(5):
        net(x)
    mx.nd.waitall()
    t = time.perf_counter()
    for _ in range(ITERS):
        y = net(x)
    y.wait_to_read()
    return (time.perf_counter() - t) / ITERS * 1e3


def time_torch(net, x):
    with torch.no_grad():
        for _ in range(5):
            net(x)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(ITERS):
            net(x)
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / ITERS * 1e3


def main():
    mnet = mx_net()
    tnet = torch_net(mnet)
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print("| batch | mxnet-rt ms | PyTorch eager ms | ratio (rt / torch) | max rel. diff |")
    print("| --- | --- | --- | --- | --- |")
    for batch in [1, 32, 256]:
        x = np.random.default_rng(batch).standard_normal((batch, IN)).astype("float32")
        xm, xt = mx.nd.array(x, ctx=mx.gpu(0)), torch.from_numpy(x).cuda()
        with torch.no_grad():
            ref = tnet(xt).cpu().numpy()
        got = mnet(xm).asnumpy()
        diff = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
        ours, theirs = [], []
        for _ in range(ROUNDS):
            ours.append(time_mx(mnet, xm))
            theirs.append(time_torch(tnet, xt))
        o, t = statistics.median(ours), statistics.median(theirs)
        print(f"| {batch} | {o:.3f} | {t:.3f} | {o / t:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
