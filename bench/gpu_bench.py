"""GPU inference: mxnet-rt (the stock 1.9.1 frontend, hybridized Gluon nets on gpu(0)) against
PyTorch eager on the same GPU; medians of alternating rounds. Runs only where a GPU and
PyTorch are present (the device machine; see scripts/gpu_check.sh); prints two tables.

1. A multilayer perceptron (three Dense layers of 1024 units, ReLU, float32), the same weights
   in both, timed in one process, rounds alternating.
2. ResNet-50 inference at batch 1 and 32: Gluon's resnet50_v1 against torchvision's resnet50,
   random weights in each (torchvision's is the "v1.5" variant: stride 2 in the 3x3 rather
   than the first 1x1 convolution of a downsampling block, about 5% more arithmetic). Each
   side runs in processes of its own, alternating: PyTorch and mxnet-rt in one process would
   both load cuDNN, and two loads of its sub-libraries fail there with
   CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH.

Both run float32 without TF32: PyTorch's TF32 switches are turned off to match mxnet-rt's
default (stock's MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION=0).

Usage: MXNET_LIBRARY_PATH=... python3 bench/gpu_bench.py [rounds]
"""
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5
ITERS = 50
HIDDEN, IN, OUT = 1024, 1024, 1000
RESNET_BATCHES = [1, 32]


def no_tf32(torch):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def mx_mlp(mx):
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(HIDDEN, activation="relu", in_units=IN),
            mx.gluon.nn.Dense(HIDDEN, activation="relu", in_units=HIDDEN),
            mx.gluon.nn.Dense(OUT, in_units=HIDDEN))
    net.initialize(mx.init.Xavier(), ctx=mx.gpu(0))
    net.hybridize()
    return net


def torch_mlp(torch, mnet):
    tn = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                             torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)).cuda().eval()
    # The same weights, so that both compute the same function.
    dense = [b for b in mnet._children.values()]
    with torch.no_grad():
        for lin, d in zip([tn[0], tn[2], tn[4]], dense):
            lin.weight.copy_(torch.from_numpy(d.weight.data().asnumpy()))
            lin.bias.copy_(torch.from_numpy(d.bias.data().asnumpy()))
    return tn


def time_mx(mx, net, x, iters=ITERS):
    for _ in range(5):
        net(x)
    mx.nd.waitall()
    t = time.perf_counter()
    for _ in range(iters):
        y = net(x)
    y.wait_to_read()
    return (time.perf_counter() - t) / iters * 1e3


def time_torch(torch, net, x, iters=ITERS):
    with torch.no_grad():
        for _ in range(5):
            net(x)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            net(x)
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


def mlp_table():
    import torch
    import mxnet as mx
    no_tf32(torch)
    mnet = mx_mlp(mx)
    tnet = torch_mlp(torch, mnet)
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print("MLP inference, float32")
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
            ours.append(time_mx(mx, mnet, xm))
            theirs.append(time_torch(torch, tnet, xt))
        o, t = statistics.median(ours), statistics.median(theirs)
        print(f"| {batch} | {o:.3f} | {t:.3f} | {o / t:.2f} | {diff:.1e} |", flush=True)


def resnet_side(side):
    """One process's timings of one side: {batch: ms}, printed as JSON."""
    times = {}
    if side == "mx":
        import mxnet as mx
        net = mx.gluon.model_zoo.vision.get_model("resnet50_v1", pretrained=False)
        net.initialize(mx.init.Xavier(), ctx=mx.gpu(0))
        net.hybridize()
        for batch in RESNET_BATCHES:
            x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype("float32")
            times[batch] = time_mx(mx, net, mx.nd.array(x, ctx=mx.gpu(0)), 20)
    else:
        import torch
        from torchvision.models import resnet50
        no_tf32(torch)
        net = resnet50().cuda().eval()
        for batch in RESNET_BATCHES:
            x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype("float32")
            times[batch] = time_torch(torch, net, torch.from_numpy(x).cuda(), 20)
    print(json.dumps(times))


def resnet_table():
    # mxnet-rt also with MXNET_ENGINE_TYPE=NaiveEngine (every operation run in the calling
    # thread): the difference is what handing operations to the GPU worker threads costs.
    sides = {"mx": {}, "mx_naive": {"MXNET_ENGINE_TYPE": "NaiveEngine"}, "torch": {}}
    runs = {side: [] for side in sides}
    for _ in range(ROUNDS):
        for side, env in sides.items():
            out = subprocess.run([sys.executable, __file__, "--resnet", side.split("_")[0]], capture_output=True,
                                 text=True, env={**os.environ, **env})
            if out.returncode != 0:
                raise SystemExit(f"the {side} side failed:\n{out.stderr[-3000:]}")
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print()
    print("ResNet-50 inference, float32 (mxnet-rt resnet50_v1 hybridized; PyTorch eager torchvision resnet50)")
    print("| batch | mxnet-rt ms | mxnet-rt NaiveEngine ms | PyTorch eager ms | ratio (rt / torch) |")
    print("| --- | --- | --- | --- | --- |")
    for batch in RESNET_BATCHES:
        o, n, t = (statistics.median(r[str(batch)] for r in runs[side]) for side in ["mx", "mx_naive", "torch"])
        print(f"| {batch} | {o:.3f} | {n:.3f} | {t:.3f} | {o / t:.2f} |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--resnet":
        resnet_side(sys.argv[2])
    else:
        mlp_table()
        resnet_table()
