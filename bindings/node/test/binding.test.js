'use strict';
const test = require('node:test');
const assert = require('node:assert');
const mx = require('../index.js');

test('arrays, operators and waits', () => {
  assert.strictEqual(mx.version(), 10901);
  const a = mx.NDArray.from([2, 3], [1, 2, 3, 4, 5, 6]);
  assert.deepStrictEqual(a.shape, [2, 3]);
  const [b] = mx.invoke('_mul_scalar', [a], { scalar: 2 });
  const [c] = mx.invoke('elemwise_add', [a, b]);
  assert.deepStrictEqual(Array.from(c.toArray()), [3, 6, 9, 12, 15, 18]);
  const [t] = mx.invoke('transpose', [a]);
  const [d] = mx.invoke('dot', [a, t]);
  d.waitToRead();
  assert.deepStrictEqual(Array.from(d.toArray()), [14, 32, 32, 77]);
  mx.waitAll();
  for (const x of [a, b, c, t, d]) x.dispose();
  assert.throws(() => a.toArray(), (e) => e instanceof mx.MXError && e.kind === 'ValueError');
});

test('errors carry the library class', () => {
  const a = mx.NDArray.from([2], [1, 2]);
  assert.throws(() => mx.invoke('no_such_op', [a]), (e) => e instanceof mx.MXError && /no_such_op/.test(e.message));
  assert.throws(() => a.copyFrom([1, 2, 3]), (e) => e.kind === 'ValueError');
  assert.throws(() => mx.invoke('Activation', [a], { act_type: 'nope' }), (e) => e instanceof mx.MXError && /act_type/.test(e.message));
  a.dispose();
  a.dispose(); // a second dispose does nothing
});
