'use strict';
// Create arrays, run a layer, wait, read back and profile, through the Node.js binding:
//   node example.js [trace.json]
const mx = require('./index.js');

const trace = process.argv[2] || 'node_demo_profile.json';
console.log(`libmxnet implements MXNet ${mx.version()} (${mx.libPath})`);
mx.profiler.setConfig({ filename: trace, profile_all: true, aggregate_stats: true });
mx.profiler.setRunning(true);

const x = mx.NDArray.from([2, 3], [1, -2, 3, -4, 5, -6]);
const w = mx.NDArray.from([4, 3], new Array(12).fill(0.5));
const b = mx.NDArray.from([4], [0, 1, 2, 3]);
const [fc] = mx.invoke('FullyConnected', [x, w, b], { num_hidden: 4 });
const [y] = mx.invoke('Activation', [fc], { act_type: 'relu' });
mx.waitAll();
const got = Array.from(y.toArray());
console.log(`relu(x·wᵀ + b) of shape [${y.shape}]: [${got}]`);
const want = [1, 2, 3, 4, 0, 0, 0, 0.5];
if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`expected ${want}`);

try {
  mx.invoke('dot', [x, x]);
  throw new Error('dot of mismatched shapes succeeded');
} catch (e) {
  if (!(e instanceof mx.MXError)) throw e;
  console.log(`as expected, dot of (2, 3) by (2, 3) fails: ${e.kind}: ${e.message.split('\n')[0]}`);
}

mx.profiler.setRunning(false);
mx.profiler.dump(true);
const summary = mx.profiler.summary();
if (!summary.includes('FullyConnected')) throw new Error('the profile lacks the operators');
console.log(`profile written to ${trace}; aggregate table has ${summary.split('\n').length} lines`);
for (const a of [x, w, b, fc, y]) a.dispose();
