//! The fused recurrent operator `RNN` (vanilla ReLU/tanh, LSTM with optional projection, GRU;
//! stacked layers, bidirectional, dropout between layers) and its backward operator.
//!
//! Owns the layout stock 1.9.1 gives the flat `parameters` input (Gluon's `_RNNLayer` fills it
//! through `_rnn_param_concat`): every layer's weights first, per layer and direction
//! `W_i2h [G·H, in]`, `W_h2h [G·H, out]` and, with a projection, `W_h2r [P, H]`; then the
//! biases, per layer and direction `b_i2h [G·H]`, `b_h2h [G·H]`. Gates are ordered (i, f, g, o)
//! for LSTM and (r, z, n) for GRU, whose new gate is `tanh(x·W_n + b_in + r ∘ (h·U_n + b_hn))`
//! as in cuDNN and stock.
//!
//! Each layer and direction multiplies the whole input sequence by `W_i2h` in one GEMM, then
//! steps through time: one GEMM of the previous state by `W_h2h`, and the gate arithmetic per
//! batch row on the kernel pool. The forward pass keeps what the backward pass needs in a
//! hidden output (the *reserve*: activated gates, cell states and the pre-projection states
//! per step, each inner layer's output and dropout mask), so backpropagation through time
//! recomputes nothing and its weight gradients are again whole-sequence GEMMs.
//!
//! As on stock's CPU build, `use_sequence_length` and LSTM state clipping are refused, and the
//! dtypes are float32 and float64. Unlike stock's CPU build, a projection (`projection_size`)
//! also trains.

use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::random::Stream;
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

use super::linalg::{gemm, GemmElem};
use super::nn::Real;

op_params! {
    pub(super) struct RnnParams<'a> => RNN_PARAMS {
        state_size: i64 = required, "size of the state for each layer";
        num_layers: i64 = required, "number of stacked layers";
        bidirectional: bool = "False", "whether to use bidirectional recurrent layers";
        mode: &'a str = required in ["gru", "lstm", "rnn_relu", "rnn_tanh"], "the type of RNN to compute";
        p: f64 = "0", "drop rate of the dropout on the outputs of each RNN layer, except the last layer.";
        state_outputs: bool = "False", "Whether to have the states as symbol outputs.";
        projection_size: Option<i64> = "None", "size of project size";
        lstm_state_clip_min: Option<f64> = "None", "Minimum clip value of LSTM states. This option must be used together with lstm_state_clip_max.";
        lstm_state_clip_max: Option<f64> = "None", "Maximum clip value of LSTM states. This option must be used together with lstm_state_clip_min.";
        lstm_state_clip_nan: bool = "False", "Whether to stop NaN from propagating in state by clipping it to min/max. If clipping range is not specified, this option is ignored.";
        use_sequence_length: bool = "False", "If set to true, this layer takes in an extra input parameter `sequence_length` to specify variable length sequence";
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    RnnRelu,
    RnnTanh,
    Lstm,
    Gru,
}

impl Mode {
    fn of(name: &str) -> Mode {
        match name {
            "rnn_relu" => Mode::RnnRelu,
            "rnn_tanh" => Mode::RnnTanh,
            "lstm" => Mode::Lstm,
            _ => Mode::Gru,
        }
    }
    fn gates(self) -> usize {
        match self {
            Mode::Lstm => 4,
            Mode::Gru => 3,
            _ => 1,
        }
    }
}

/// The sizes of one call: the layout of the parameters and of the reserve.
#[derive(Clone, Copy, Debug)]
struct Geom {
    mode: Mode,
    /// Sequence length, batch size, input size, state size.
    t: usize,
    n: usize,
    i: usize,
    h: usize,
    /// Projection size (0: none).
    p: usize,
    layers: usize,
    dirs: usize,
    dropout: f64,
}

impl Geom {
    /// Validates the parameters (as stock's CPU operator does) and reads the sizes.
    fn new(a: &Attrs) -> Result<Geom> {
        let op = a.op;
        let p = RnnParams::of(a);
        let mode = Mode::of(p.mode);
        if p.use_sequence_length {
            return Err(Error::mxnet(format!(
                "operator {op}: use_sequence_length is only available with cuDNN (as in stock MXNet's CPU build)"
            )));
        }
        if p.lstm_state_clip_min.is_some() || p.lstm_state_clip_max.is_some() {
            return Err(Error::mxnet(format!(
                "operator {op}: LSTM state clipping (lstm_state_clip_min/max) is only supported with cuDNN (as in stock MXNet's CPU build)"
            )));
        }
        if !(0.0..1.0).contains(&p.p) {
            return Err(Error::value(format!("operator {op}: p must be in [0, 1), got {}", p.p)));
        }
        if p.state_size <= 0 || p.num_layers <= 0 {
            return Err(Error::value(format!(
                "operator {op}: state_size and num_layers must be positive, got {} and {}",
                p.state_size, p.num_layers
            )));
        }
        let proj = match p.projection_size {
            None => 0,
            Some(_) if mode != Mode::Lstm => {
                return Err(Error::mxnet(format!("operator {op}: projection is only supported for LSTM")))
            }
            Some(s) if s <= 0 || s > p.state_size => {
                return Err(Error::value(format!(
                    "operator {op}: projection_size must be in [1, state_size={}], got {s}",
                    p.state_size
                )))
            }
            Some(s) => s as usize,
        };
        Ok(Geom {
            mode,
            t: 0,
            n: 0,
            i: 0,
            h: p.state_size as usize,
            p: proj,
            layers: p.num_layers as usize,
            dirs: 1 + p.bidirectional as usize,
            dropout: p.p,
        })
    }

    /// With the data's shape `[T, N, I]`.
    fn with_data(mut self, op: &str, shape: &[usize]) -> Result<Geom> {
        let &[t, n, i] = shape else {
            return Err(Error::value(format!(
                "operator {op}: data must have 3 dimensions [sequence length, batch size, input size], got {shape:?}"
            )));
        };
        (self.t, self.n, self.i) = (t, n, i);
        Ok(self)
    }

    fn gh(&self) -> usize {
        self.mode.gates() * self.h
    }
    /// The size of a layer's output per direction (the projection size, else the state size).
    fn ho(&self) -> usize {
        if self.p > 0 {
            self.p
        } else {
            self.h
        }
    }
    fn input(&self, l: usize) -> usize {
        if l == 0 {
            self.i
        } else {
            self.dirs * self.ho()
        }
    }
    /// The weights of one direction of layer `l`: `W_i2h`, `W_h2h`, `W_h2r`.
    fn w_len(&self, l: usize) -> usize {
        self.gh() * (self.input(l) + self.ho()) + self.p * self.h
    }
    fn w_off(&self, l: usize, d: usize) -> usize {
        // Every layer after the first has the same size.
        let before = if l == 0 { 0 } else { self.dirs * (self.w_len(0) + (l - 1) * self.w_len(1)) };
        before + d * self.w_len(l)
    }

    /// Refuses sizes whose parameter vector, states or reserve would not fit in memory
    /// (so the unchecked arithmetic elsewhere cannot overflow).
    fn check_sizes(&self, op: &str) -> Result<()> {
        let (t, n, i, h, p) = (self.t as u128, self.n as u128, self.i as u128, self.h as u128, self.p as u128);
        let (l, d, g) = (self.layers as u128, self.dirs as u128, self.mode.gates() as u128);
        let ho = if p > 0 { p } else { h };
        let params = d * g * h * (i + ho + 2) + (l - 1) * d * g * h * (d * ho + ho + 2) + p * h * l * d;
        let reserve = l * d * t * n * 6 * h + l * t * n * d * ho * 2;
        let limit = isize::MAX as u128 / 8;
        if params > limit || reserve > limit || l * d * n * h > limit {
            return Err(Error::value(format!(
                "operator {op}: state_size {}, num_layers {} and data {:?} give arrays too large to allocate",
                self.h,
                self.layers,
                [self.t, self.n, self.i]
            )));
        }
        Ok(())
    }
    fn b_off(&self, l: usize, d: usize) -> usize {
        self.w_off(self.layers, 0) + (l * self.dirs + d) * 2 * self.gh()
    }
    fn param_len(&self) -> usize {
        self.b_off(self.layers, 0)
    }
    fn state_shape(&self, size: usize) -> Vec<usize> {
        vec![self.layers * self.dirs, self.n, size]
    }
    /// What one step of one batch row keeps, per layer and direction: LSTM the activated
    /// gates, the cell state and the state before projection; GRU the gates, `h·U_n + b_hn`
    /// and the new state; vanilla the new state.
    fn step(&self) -> usize {
        match self.mode {
            Mode::Lstm => 6 * self.h,
            Mode::Gru => 5 * self.h,
            _ => self.h,
        }
    }
    fn cell_len(&self) -> usize {
        self.t * self.n * self.step()
    }
    fn y_len(&self) -> usize {
        self.t * self.n * self.dirs * self.ho()
    }
    /// Each inner layer keeps its output and, with dropout, its mask.
    fn inner_len(&self) -> usize {
        self.y_len() * (1 + (self.dropout > 0.0) as usize)
    }
    fn inner_off(&self, l: usize) -> usize {
        self.layers * self.dirs * self.cell_len() + l * self.inner_len()
    }
    fn reserve_len(&self) -> usize {
        self.inner_off(self.layers - 1)
    }
}

fn lstm(a: &Attrs) -> bool {
    RnnParams::of(a).mode == "lstm"
}

/// data, parameters, state, then state_cell (LSTM) and sequence_length (when used): a GRU's
/// lengths are its fourth input, named `sequence_length` as in stock.
fn input_mask(a: &Attrs) -> u32 {
    0b111 | (lstm(a) as u32) << 3 | (RnnParams::of(a).use_sequence_length as u32) << 4
}

/// Output, final state, final cell state (LSTM), reserve: the states are visible with
/// `state_outputs`, the reserve never.
fn num_outputs(a: &Attrs) -> usize {
    3 + lstm(a) as usize
}

fn num_visible(a: &Attrs) -> usize {
    if RnnParams::of(a).state_outputs {
        2 + lstm(a) as usize
    } else {
        1
    }
}

fn infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    let g = Geom::new(a)?.with_data(op, &ins[0].shape)?;
    g.check_sizes(op)?;
    let dtype = ins[0].dtype;
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(Error::type_error(format!("operator {op} supports float32 and float64, not {}", dtype.name())));
    }
    let expect = |k: usize, what: &str, shape: Vec<usize>| -> Result<()> {
        let m = &ins[k];
        if m.shape != shape {
            return Err(Error::value(format!("operator {op}: {what} has shape {:?}, expected {shape:?}", m.shape)));
        }
        if m.dtype != dtype {
            return Err(Error::type_error(format!(
                "operator {op}: {what} has dtype {}, expected {} like the data",
                m.dtype.name(),
                dtype.name()
            )));
        }
        Ok(())
    };
    expect(1, "parameters", vec![g.param_len()])?;
    expect(2, "state", g.state_shape(g.ho()))?;
    if g.mode == Mode::Lstm {
        expect(3, "state_cell", g.state_shape(g.h))?;
    }
    let mut outs = vec![Meta::new(vec![g.t, g.n, g.dirs * g.ho()], dtype), Meta::new(g.state_shape(g.ho()), dtype)];
    if g.mode == Mode::Lstm {
        outs.push(Meta::new(g.state_shape(g.h), dtype));
    }
    outs.push(Meta::new(vec![g.reserve_len()], dtype));
    Ok(outs)
}

/// Graph inference of the parameter vector and the initial states from the data's shape.
fn param_shapes(a: &Attrs, data: &[i64], n: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let mut g = Geom::new(a)?;
    if data.len() != 3 {
        return Err(Error::value(format!("operator {}: data must have 3 dimensions, got {data:?}", a.op)));
    }
    let batch = data[1];
    let mut out = Vec::new();
    let states = (g.layers * g.dirs) as i64;
    out.push((2, vec![states, batch, g.ho() as i64]));
    if g.mode == Mode::Lstm && n > 3 {
        out.push((3, vec![states, batch, g.h as i64]));
    }
    if data[2] >= 0 {
        g.i = data[2] as usize;
        g.check_sizes(a.op)?;
        out.push((1, vec![g.param_len() as i64]));
    }
    Ok(out)
}

/// The float types the operator computes in.
trait Float: GemmElem + Real {
    fn tanh(self) -> Self;
}

impl Float for f32 {
    fn tanh(self) -> Self {
        f32::tanh(self)
    }
}

impl Float for f64 {
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
}

#[inline(always)]
fn sigmoid<T: Float>(x: T) -> T {
    T::of(1.0) / (T::of(1.0) + (-x).exp())
}

/// `c (m×n) = [c +] a·b` for operands given with their (row, column) strides in elements.
#[allow(clippy::too_many_arguments)]
fn mm<T: Float>(
    m: usize,
    n: usize,
    k: usize,
    a: (&[T], usize, usize),
    b: (&[T], usize, usize),
    c: &mut [T],
    acc: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !acc {
            c[..m * n].fill(T::of(0.0));
        }
        return;
    }
    T::mm(m, n, k, (a.0, a.1 as isize, a.2 as isize), (b.0, b.1 as isize, b.2 as isize), c, acc);
}

/// One direction of one layer: its weights and biases (slices of the parameter vector).
struct Cell<'a, T> {
    wx: &'a [T],
    wh: &'a [T],
    whr: &'a [T],
    bx: &'a [T],
    bh: &'a [T],
}

impl<'a, T: Float> Cell<'a, T> {
    fn of(g: &Geom, w: &'a [T], l: usize, d: usize) -> Self {
        let (gh, input, ho) = (g.gh(), g.input(l), g.ho());
        let wo = g.w_off(l, d);
        let wx = &w[wo..wo + gh * input];
        let wh = &w[wo + gh * input..wo + gh * (input + ho)];
        let whr = &w[wo + gh * (input + ho)..wo + g.w_len(l)];
        let bo = g.b_off(l, d);
        Cell { wx, wh, whr, bx: &w[bo..bo + gh], bh: &w[bo + gh..bo + 2 * gh] }
    }
}

/// The time step `s` of a direction's pass reads time `t`; the previous step read `prev`.
fn time(g: &Geom, d: usize, s: usize) -> usize {
    if d == 0 {
        s
    } else {
        g.t - 1 - s
    }
}

/// One batch row of one step forward: `xw`/`hw` are the input's and the previous state's
/// products (G·H each), `c_prev`/`h_prev` the previous cell state and state; writes the row's
/// reserve (see [`Geom::step`]).
#[inline]
#[allow(clippy::too_many_arguments)]
fn step_forward<T: Float>(
    mode: Mode,
    h: usize,
    cell: &Cell<T>,
    xw: &[T],
    hw: &[T],
    c_prev: &[T],
    h_prev: &[T],
    out: &mut [T],
) {
    let one = T::of(1.0);
    match mode {
        Mode::Lstm => {
            let (gates, rest) = out.split_at_mut(4 * h);
            let (c, hp) = rest.split_at_mut(h);
            for j in 0..h {
                let pre = |k: usize| xw[k * h + j] + hw[k * h + j] + cell.bx[k * h + j] + cell.bh[k * h + j];
                let (i, f, gg, o) = (sigmoid(pre(0)), sigmoid(pre(1)), pre(2).tanh(), sigmoid(pre(3)));
                let ct = f * c_prev[j] + i * gg;
                gates[j] = i;
                gates[h + j] = f;
                gates[2 * h + j] = gg;
                gates[3 * h + j] = o;
                c[j] = ct;
                hp[j] = o * ct.tanh();
            }
        }
        Mode::Gru => {
            let (gates, rest) = out.split_at_mut(3 * h);
            let (hn, hnew) = rest.split_at_mut(h);
            for j in 0..h {
                let r = sigmoid(xw[j] + hw[j] + cell.bx[j] + cell.bh[j]);
                let z = sigmoid(xw[h + j] + hw[h + j] + cell.bx[h + j] + cell.bh[h + j]);
                let un = hw[2 * h + j] + cell.bh[2 * h + j];
                let nn = (xw[2 * h + j] + cell.bx[2 * h + j] + r * un).tanh();
                gates[j] = r;
                gates[h + j] = z;
                gates[2 * h + j] = nn;
                hn[j] = un;
                hnew[j] = (one - z) * nn + z * h_prev[j];
            }
        }
        Mode::RnnTanh | Mode::RnnRelu => {
            for j in 0..h {
                let pre = xw[j] + hw[j] + cell.bx[j] + cell.bh[j];
                out[j] = if mode == Mode::RnnTanh {
                    pre.tanh()
                } else if pre > T::of(0.0) {
                    pre
                } else {
                    T::of(0.0)
                };
            }
        }
    }
}

/// Where the new state (before projection) and the cell state sit in a reserve row.
fn state_at(mode: Mode, h: usize) -> usize {
    match mode {
        Mode::Lstm => 5 * h,
        Mode::Gru => 4 * h,
        _ => 0,
    }
}

/// The forward pass of one direction of one layer over the whole sequence `x` ([T, N, in]):
/// writes its columns of `y` ([T, N, dirs·ho]), its reserve `res` ([T, N, step]) and its
/// final states `hy` ([N, ho]), `cy` ([N, H], LSTM).
#[allow(clippy::too_many_arguments)]
fn forward_dir<T: Float>(
    g: &Geom,
    cell: &Cell<T>,
    input: usize,
    d: usize,
    x: &[T],
    h0: &[T],
    c0: &[T],
    y: &mut [T],
    res: &mut [T],
    hy: &mut [T],
    cy: &mut [T],
) {
    let (t_len, n, h, ho, gh, step) = (g.t, g.n, g.h, g.ho(), g.gh(), g.step());
    let mut xw = vec![T::of(0.0); t_len * n * gh];
    gemm(t_len * n, gh, input, x, false, cell.wx, true, &mut xw, false);
    let mut hcur = h0.to_vec();
    let mut ccur = c0.to_vec();
    let mut hw = vec![T::of(0.0); n * gh];
    let at = state_at(g.mode, h);
    let cost = Cost((gh * 12) as f64);
    for s in 0..t_len {
        let t = time(g, d, s);
        mm(n, gh, ho, (&hcur, ho, 1), (cell.wh, 1, ho), &mut hw, false);
        let rows = &mut res[t * n * step..(t + 1) * n * step];
        let xt = &xw[t * n * gh..(t + 1) * n * gh];
        let (hc, cc, hwr) = (&hcur, &ccur, &hw);
        par_for_mut(rows, step, cost, T::DTYPE, |range, out| {
            for (b, row) in range.zip(out.chunks_mut(step)) {
                let c_prev: &[T] = if g.mode == Mode::Lstm { &cc[b * h..(b + 1) * h] } else { &[] };
                let h_prev = &hc[b * ho..(b + 1) * ho];
                step_forward(
                    g.mode,
                    h,
                    cell,
                    &xt[b * gh..(b + 1) * gh],
                    &hwr[b * gh..(b + 1) * gh],
                    c_prev,
                    h_prev,
                    row,
                );
            }
        });
        if g.mode == Mode::Lstm {
            for b in 0..n {
                ccur[b * h..(b + 1) * h].copy_from_slice(&rows[b * step + 4 * h..b * step + 5 * h]);
            }
        }
        if g.p > 0 {
            // h_t = W_h2r · r_t
            mm(n, ho, h, (&rows[at..], step, 1), (cell.whr, 1, h), &mut hcur, false);
        } else {
            for b in 0..n {
                hcur[b * ho..(b + 1) * ho].copy_from_slice(&rows[b * step + at..b * step + at + h]);
            }
        }
        let width = g.dirs * ho;
        for b in 0..n {
            let o = (t * n + b) * width + d * ho;
            y[o..o + ho].copy_from_slice(&hcur[b * ho..(b + 1) * ho]);
        }
    }
    hy.copy_from_slice(&hcur);
    cy.copy_from_slice(&ccur);
}

/// Inverted dropout of an inner layer's output: the mask holds 0 or 1/(1-p), drawn from the
/// call's random stream at `base + i`.
fn dropout_mask<T: Float>(mask: &mut [T], p: f64, rng: &Stream, base: u64) {
    let scale = T::of(1.0 / (1.0 - p));
    for (i, m) in mask.iter_mut().enumerate() {
        *m = if rng.uniform(base + i as u64) < p { T::of(0.0) } else { scale };
    }
}

fn forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let g = Geom::new(a)?.with_data(a.op, &ins[0].shape)?;
    match ins[0].dtype {
        DType::F32 => forward_typed::<f32>(cx, &g, ins, outs),
        DType::F64 => forward_typed::<f64>(cx, &g, ins, outs),
        other => {
            Err(Error::type_error(format!("operator {} supports float32 and float64, not {}", a.op, other.name())))
        }
    }
}

fn forward_typed<T: Float>(cx: &OpCtx, g: &Geom, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (x, w, hx) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>());
    let cx0: &[T] = if g.mode == Mode::Lstm { ins[3].as_slice::<T>() } else { &[] };
    let train_dropout = cx.is_train && g.dropout > 0.0;
    let rng =
        if train_dropout { Some(cx.rng.ok_or_else(|| Error::internal("RNN has no random stream"))?) } else { None };
    let (ho, h, n) = (g.ho(), g.h, g.n);
    let (y_out, rest) = outs.split_at_mut(1);
    let y_out = y_out[0].as_mut::<T>();
    let (hy_out, rest) = rest.split_at_mut(1);
    let hy_out = hy_out[0].as_mut::<T>();
    let (cy_out, res_out): (&mut [T], &mut OutBlob) = if g.mode == Mode::Lstm {
        let (c, r) = rest.split_at_mut(1);
        (c[0].as_mut::<T>(), &mut r[0])
    } else {
        (&mut [], &mut rest[0])
    };
    let res = res_out.as_mut::<T>();
    if g.t == 0 || g.n == 0 {
        hy_out.copy_from_slice(hx);
        cy_out.copy_from_slice(cx0);
        return Ok(());
    }
    let (cells, inner) = res.split_at_mut(g.inner_off(0));
    let mut inner = inner;
    let mut layer_in: Vec<T> = Vec::new();
    for l in 0..g.layers {
        let input = g.input(l);
        let last = l + 1 == g.layers;
        // The layer's output: the operator's output for the last layer, else the reserve.
        let (y, masks): (&mut [T], &mut [T]) = if last {
            (&mut *y_out, &mut [])
        } else {
            let (this, next) = std::mem::take(&mut inner).split_at_mut(g.inner_len());
            inner = next;
            this.split_at_mut(g.y_len())
        };
        for d in 0..g.dirs {
            let k = l * g.dirs + d;
            let xs: &[T] = if l == 0 { x } else { &layer_in };
            let cell = Cell::of(g, w, l, d);
            let res_cell = &mut cells[k * g.cell_len()..(k + 1) * g.cell_len()];
            let c0: &[T] = if g.mode == Mode::Lstm { &cx0[k * n * h..(k + 1) * n * h] } else { &[] };
            let cy: &mut [T] = if g.mode == Mode::Lstm { &mut cy_out[k * n * h..(k + 1) * n * h] } else { &mut [] };
            forward_dir(
                g,
                &cell,
                input,
                d,
                xs,
                &hx[k * n * ho..(k + 1) * n * ho],
                c0,
                y,
                res_cell,
                &mut hy_out[k * n * ho..(k + 1) * n * ho],
                cy,
            );
        }
        if !last {
            layer_in = y.to_vec();
            if g.dropout > 0.0 {
                match &rng {
                    Some(rng) => dropout_mask(masks, g.dropout, rng, (l * g.y_len()) as u64),
                    None => masks.fill(T::of(1.0)),
                }
                for (v, m) in layer_in.iter_mut().zip(masks.iter()) {
                    *v = *v * *m;
                }
            }
        }
    }
    Ok(())
}

/// One batch row of one step backward. `row` is the step's reserve; `dr` the gradient of the
/// new state before projection; `dc` (LSTM) the gradient of the cell state, replaced by that
/// of the previous cell state. Writes the gradients of the gate pre-activations seen from the
/// input (`dx`) and from the previous state (`dh`; they differ only in GRU's new gate), and
/// GRU's direct gradient of the previous state (`dh_prev`, else zeros).
#[inline]
#[allow(clippy::too_many_arguments)]
fn step_backward<T: Float>(
    mode: Mode,
    h: usize,
    row: &[T],
    c_prev: &[T],
    h_prev: &[T],
    dr: &[T],
    dc: &mut [T],
    dx: &mut [T],
    dh: &mut [T],
    dh_prev: &mut [T],
) {
    let one = T::of(1.0);
    match mode {
        Mode::Lstm => {
            for j in 0..h {
                let (i, f, gg, o) = (row[j], row[h + j], row[2 * h + j], row[3 * h + j]);
                let tc = row[4 * h + j].tanh();
                let dct = dc[j] + dr[j] * o * (one - tc * tc);
                dx[j] = dct * gg * i * (one - i);
                dx[h + j] = dct * c_prev[j] * f * (one - f);
                dx[2 * h + j] = dct * i * (one - gg * gg);
                dx[3 * h + j] = dr[j] * tc * o * (one - o);
                dc[j] = dct * f;
            }
            dh.copy_from_slice(dx);
        }
        Mode::Gru => {
            for j in 0..h {
                let (r, z, nn, un) = (row[j], row[h + j], row[2 * h + j], row[3 * h + j]);
                let dn = dr[j] * (one - z) * (one - nn * nn);
                let dpr = dn * un * r * (one - r);
                let dpz = dr[j] * (h_prev[j] - nn) * z * (one - z);
                dx[j] = dpr;
                dx[h + j] = dpz;
                dx[2 * h + j] = dn;
                dh[j] = dpr;
                dh[h + j] = dpz;
                dh[2 * h + j] = dn * r;
                dh_prev[j] = dr[j] * z;
            }
        }
        Mode::RnnTanh | Mode::RnnRelu => {
            for j in 0..h {
                let y = row[j];
                dx[j] = if mode == Mode::RnnTanh {
                    dr[j] * (one - y * y)
                } else if y > T::of(0.0) {
                    dr[j]
                } else {
                    T::of(0.0)
                };
            }
            dh.copy_from_slice(dx);
        }
    }
}

/// What one direction of one layer reads in the backward pass.
struct DirIn<'a, T> {
    cell: Cell<'a, T>,
    input: usize,
    d: usize,
    /// The layer's input [T, N, in] and output [T, N, dirs·ho].
    x: &'a [T],
    y: &'a [T],
    /// Initial states [N, ho], [N, H].
    h0: &'a [T],
    c0: &'a [T],
    res: &'a [T],
    /// Gradient of the layer's output, and of the final states.
    dy: &'a [T],
    dhy: &'a [T],
    dcy: &'a [T],
}

/// What one direction of one layer writes in the backward pass: `dx` is added to (both
/// directions read the same input); the others are this direction's own.
struct DirOut<'a, T> {
    dx: &'a mut [T],
    dw: &'a mut [T],
    db: &'a mut [T],
    dh0: &'a mut [T],
    dc0: &'a mut [T],
}

fn backward_dir<T: Float>(g: &Geom, a: &DirIn<T>, o: DirOut<T>) {
    let (t_len, n, h, ho, gh, step) = (g.t, g.n, g.h, g.ho(), g.gh(), g.step());
    let (d, input, width) = (a.d, a.input, g.dirs * g.ho());
    let zero = T::of(0.0);
    let at = state_at(g.mode, h);
    let mut dh = a.dhy.to_vec();
    let mut dc = a.dcy.to_vec();
    let mut dr = vec![zero; n * h];
    let mut dpx = vec![zero; t_len * n * gh];
    let mut dph = vec![zero; t_len * n * gh];
    let mut dh_prev = vec![zero; n * h];
    let (dwx, rest) = o.dw.split_at_mut(gh * input);
    let (dwh, dwhr) = rest.split_at_mut(gh * ho);
    dwhr.fill(zero);
    // Row b of the state before time t's step: h0, or the direction's output one step back.
    let prev_row = |s: usize, b: usize| -> &[T] {
        if s == 0 {
            &a.h0[b * ho..(b + 1) * ho]
        } else {
            let tp = time(g, d, s - 1);
            &a.y[(tp * n + b) * width + d * ho..(tp * n + b) * width + (d + 1) * ho]
        }
    };
    let cost = Cost((gh * 12) as f64);
    let mut scratch = vec![zero; n * (2 * gh + 2 * h)];
    for s in (0..t_len).rev() {
        let t = time(g, d, s);
        for b in 0..n {
            let o = (t * n + b) * width + d * ho;
            for (v, gy) in dh[b * ho..(b + 1) * ho].iter_mut().zip(&a.dy[o..o + ho]) {
                *v = *v + *gy;
            }
        }
        let rows = &a.res[t * n * step..(t + 1) * n * step];
        if g.p > 0 {
            // h = W_h2r · r: dr = dh · W_h2r, dW_h2r += dhᵀ · r.
            mm(n, h, ho, (&dh, ho, 1), (a.cell.whr, h, 1), &mut dr, false);
            mm(ho, h, n, (&dh, 1, ho), (&rows[at..], step, 1), dwhr, true);
        } else {
            dr.copy_from_slice(&dh);
        }
        let c_prev_all: Option<&[T]> = (g.mode == Mode::Lstm && s > 0).then(|| {
            let tp = time(g, d, s - 1);
            &a.res[tp * n * step..(tp + 1) * n * step]
        });
        let unit = 2 * gh + 2 * h;
        let (drr, dcr) = (&dr, &dc);
        par_for_mut(&mut scratch, unit, cost, T::DTYPE, |range, out| {
            for (b, buf) in range.zip(out.chunks_mut(unit)) {
                let (bx, rest) = buf.split_at_mut(gh);
                let (bh, rest) = rest.split_at_mut(gh);
                let (bc, bhp) = rest.split_at_mut(h);
                let c_prev: &[T] = match (g.mode, c_prev_all) {
                    (Mode::Lstm, Some(p)) => &p[b * step + 4 * h..b * step + 5 * h],
                    (Mode::Lstm, None) => &a.c0[b * h..(b + 1) * h],
                    _ => &[],
                };
                if g.mode == Mode::Lstm {
                    bc.copy_from_slice(&dcr[b * h..(b + 1) * h]);
                }
                let h_prev = if g.mode == Mode::Gru { prev_row(s, b) } else { &[] };
                step_backward(
                    g.mode,
                    h,
                    &rows[b * step..(b + 1) * step],
                    c_prev,
                    h_prev,
                    &drr[b * h..(b + 1) * h],
                    bc,
                    bx,
                    bh,
                    bhp,
                );
            }
        });
        for b in 0..n {
            let buf = &scratch[b * unit..(b + 1) * unit];
            let r = (t * n + b) * gh;
            dpx[r..r + gh].copy_from_slice(&buf[..gh]);
            dph[r..r + gh].copy_from_slice(&buf[gh..2 * gh]);
            if g.mode == Mode::Lstm {
                dc[b * h..(b + 1) * h].copy_from_slice(&buf[2 * gh..2 * gh + h]);
            }
            if g.mode == Mode::Gru {
                dh_prev[b * h..(b + 1) * h].copy_from_slice(&buf[2 * gh + h..]);
            }
        }
        // The previous state's gradient: through W_h2h, plus GRU's direct path.
        mm(n, ho, gh, (&dph[t * n * gh..], gh, 1), (a.cell.wh, ho, 1), &mut dh, false);
        if g.mode == Mode::Gru {
            for (v, p) in dh.iter_mut().zip(&dh_prev) {
                *v = *v + *p;
            }
        }
    }
    o.dh0.copy_from_slice(&dh);
    o.dc0.copy_from_slice(&dc);
    // Whole-sequence products: dx += dpx · W_i2h, dW_i2h = dpxᵀ · x.
    gemm(t_len * n, input, gh, &dpx, false, a.cell.wx, false, o.dx, true);
    gemm(gh, input, t_len * n, &dpx, true, a.x, false, dwx, false);
    // dW_h2h = Σ_t dph_tᵀ · h_prev(t): the steps after the first read the output one step back
    // (one strided product), the first reads h0.
    let first = time(g, d, 0);
    mm(gh, ho, n, (&dph[first * n * gh..], 1, gh), (a.h0, ho, 1), dwh, false);
    if t_len > 1 {
        let rows = (t_len - 1) * n;
        let (dph_from, y_from) = if d == 0 { (n * gh, 0) } else { (0, n * width) };
        mm(gh, ho, rows, (&dph[dph_from..], 1, gh), (&a.y[y_from + d * ho..], width, 1), dwh, true);
    }
    let (dbx, dbh) = o.db.split_at_mut(gh);
    dbx.fill(zero);
    dbh.fill(zero);
    for (x_row, h_row) in dpx.chunks(gh).zip(dph.chunks(gh)) {
        for j in 0..gh {
            dbx[j] = dbx[j] + x_row[j];
            dbh[j] = dbh[j] + h_row[j];
        }
    }
}

/// `_backward_RNN(dy[, dhy[, dcy]], data, parameters, state[, state_cell], y, hy[, cy],
/// reserve) -> (ddata, dparameters, dstate[, dstate_cell])`.
fn backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let nv = num_visible(a);
    let g = Geom::new(a)?.with_data(a.op, &ins[nv].shape)?;
    match ins[nv].dtype {
        DType::F32 => backward_typed::<f32>(cx, &g, nv, ins, outs),
        DType::F64 => backward_typed::<f64>(cx, &g, nv, ins, outs),
        other => {
            Err(Error::type_error(format!("operator {} supports float32 and float64, not {}", a.op, other.name())))
        }
    }
}

fn backward_typed<T: Float>(cx: &OpCtx, g: &Geom, nv: usize, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let lstm = g.mode == Mode::Lstm;
    let ni = 3 + lstm as usize;
    let zero = T::of(0.0);
    let (ho, h, n) = (g.ho(), g.h, g.n);
    let states = g.layers * g.dirs;
    let dy_top = ins[0].as_slice::<T>();
    let zeros_h = vec![zero; states * n * ho];
    let zeros_c = vec![zero; if lstm { states * n * h } else { 0 }];
    let dhy: &[T] = if nv > 1 { ins[1].as_slice::<T>() } else { &zeros_h };
    let dcy: &[T] = if nv > 2 { ins[2].as_slice::<T>() } else { &zeros_c };
    let fwd = &ins[nv..];
    let (x, w, hx) = (fwd[0].as_slice::<T>(), fwd[1].as_slice::<T>(), fwd[2].as_slice::<T>());
    let c0: &[T] = if lstm { fwd[3].as_slice::<T>() } else { &[] };
    let y_last = fwd[ni].as_slice::<T>();
    let res = fwd[fwd.len() - 1].as_slice::<T>();
    let mut dx = vec![zero; x.len()];
    let mut dw = vec![zero; w.len()];
    let mut dhx = vec![zero; hx.len()];
    let mut dcx = vec![zero; c0.len()];
    if g.t == 0 || g.n == 0 {
        // The final states are the initial ones.
        dhx.copy_from_slice(dhy);
        dcx.copy_from_slice(dcy);
    } else {
        let mut dy: Vec<T> = dy_top.to_vec();
        for l in (0..g.layers).rev() {
            let input = g.input(l);
            // The layer's input: the data, or the inner layer below's output after dropout.
            let below = (l > 0).then(|| {
                let off = g.inner_off(l - 1);
                let y = &res[off..off + g.y_len()];
                let mask = (g.dropout > 0.0).then(|| &res[off + g.y_len()..off + 2 * g.y_len()]);
                (y, mask)
            });
            let layer_x: Vec<T> = match below {
                Some((y, Some(mask))) => y.iter().zip(mask).map(|(v, m)| *v * *m).collect(),
                Some((y, None)) => y.to_vec(),
                None => Vec::new(),
            };
            let xs: &[T] = if l == 0 { x } else { &layer_x };
            let y: &[T] = if l + 1 == g.layers {
                y_last
            } else {
                let off = g.inner_off(l);
                &res[off..off + g.y_len()]
            };
            let mut dlx = vec![zero; g.t * n * input];
            for d in 0..g.dirs {
                let k = l * g.dirs + d;
                let cells = &res[k * g.cell_len()..(k + 1) * g.cell_len()];
                let wo = g.w_off(l, d);
                let bo = g.b_off(l, d);
                // The weights and biases of one cell are disjoint ranges of `dw`.
                let (head, tail) = dw.split_at_mut(bo);
                let dwc = &mut head[wo..wo + g.w_len(l)];
                let dbc = &mut tail[..2 * g.gh()];
                let hs = k * n * ho..(k + 1) * n * ho;
                let cs = if lstm { k * n * h..(k + 1) * n * h } else { 0..0 };
                let input_args = DirIn {
                    cell: Cell::of(g, w, l, d),
                    input,
                    d,
                    x: xs,
                    y,
                    h0: &hx[hs.clone()],
                    c0: &c0[cs.clone()],
                    res: cells,
                    dy: &dy,
                    dhy: &dhy[hs.clone()],
                    dcy: &dcy[cs.clone()],
                };
                let out_args = DirOut { dx: &mut dlx, dw: dwc, db: dbc, dh0: &mut dhx[hs], dc0: &mut dcx[cs] };
                backward_dir(g, &input_args, out_args);
            }
            if l == 0 {
                dx = dlx;
            } else {
                // Through the dropout below: the gradient of the inner layer's output.
                if let Some((_, Some(mask))) = below {
                    for (v, m) in dlx.iter_mut().zip(mask) {
                        *v = *v * *m;
                    }
                }
                dy = dlx;
            }
        }
    }
    let grads: [&[T]; 4] = [&dx, &dw, &dhx, &dcx];
    for (k, (o, r)) in outs.iter_mut().zip(cx.req).enumerate().take(ni) {
        if *r != Req::Null {
            o.as_mut::<T>().copy_from_slice(grads[k]);
        }
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "RNN",
            Inputs::Selected(&["data", "parameters", "state", "state_cell", "sequence_length"], input_mask),
            Box::new(infer),
            Box::new(forward),
        )
        .alias(&["_npx_rnn"])
        .params(RNN_PARAMS)
        .outputs(num_outputs, num_visible)
        .output_names(&["output", "state_output", "statecell_output"])
        .param_shapes(param_shapes)
        .resources(&[crate::op::Resource::Random])
        .never_mirrored()
        .grad(Grad::Backward { op: "_backward_RNN", inputs: true, outputs: true })
        .doc(
            "Applies recurrent layers to input data. Currently, vanilla RNN, LSTM and GRU are implemented, with both \
             multi-layer and bidirectional support.",
        ),
    );
    ops.push(OpDef::backward("_backward_RNN", RNN_PARAMS, Box::new(backward)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(mode: Mode, layers: usize, dirs: usize, p: usize) -> Geom {
        Geom { mode, t: 3, n: 2, i: 4, h: 5, p, layers, dirs, dropout: 0.0 }
    }

    #[test]
    fn parameter_sizes_are_stocks() {
        // Stock's GetRnnParamSize: (I + H + 2)·G·H·D for the first layer, (D·H + H + 2)·G·H·D
        // for each other, plus P·H·L·D with a projection (whose state size is P).
        let size = |mode: Mode, l: usize, d: usize, p: usize| {
            let (i, h, gates) = (4, 5, mode.gates());
            let o = if p > 0 { p } else { h };
            let first = (i + o + 2) * gates * h * d;
            let other = (o * d + o + 2) * gates * h * d;
            first + (l - 1) * other + p * h * l * d
        };
        for mode in [Mode::RnnRelu, Mode::RnnTanh, Mode::Lstm, Mode::Gru] {
            for (l, d) in [(1, 1), (2, 1), (1, 2), (3, 2)] {
                assert_eq!(geom(mode, l, d, 0).param_len(), size(mode, l, d, 0), "{mode:?} {l} {d}");
            }
        }
        assert_eq!(geom(Mode::Lstm, 2, 2, 3).param_len(), size(Mode::Lstm, 2, 2, 3));
        // Biases follow all weights, per layer and direction.
        let g = geom(Mode::Gru, 2, 2, 0);
        assert_eq!(g.b_off(0, 0), g.w_off(2, 0));
        assert_eq!(g.b_off(1, 1), g.param_len() - 2 * g.gh());
    }

    /// Central differences of the loss Σ y·u (a fixed u) against the backward pass, in f64.
    #[test]
    fn gradients_match_finite_differences() {
        for (mode, layers, dirs, p) in [
            (Mode::Lstm, 2, 2, 0),
            (Mode::Gru, 2, 1, 0),
            (Mode::RnnTanh, 1, 2, 0),
            (Mode::RnnRelu, 1, 1, 0),
            (Mode::Lstm, 1, 2, 3),
        ] {
            let g = geom(mode, layers, dirs, p);
            let states = layers * dirs;
            let lstm = mode == Mode::Lstm;
            let val = |k: usize, scale: f64| ((k as f64 * 0.618).fract() - 0.5) * scale;
            let x: Vec<f64> = (0..g.t * g.n * g.i).map(|k| val(k, 2.0)).collect();
            let w: Vec<f64> = (0..g.param_len()).map(|k| val(k + 7, 0.8)).collect();
            let h0: Vec<f64> = (0..states * g.n * g.ho()).map(|k| val(k + 3, 1.0)).collect();
            let c0: Vec<f64> = (0..if lstm { states * g.n * g.h } else { 0 }).map(|k| val(k + 5, 1.0)).collect();
            let u: Vec<f64> = (0..g.y_len()).map(|k| val(k + 11, 1.0)).collect();
            let uh: Vec<f64> = (0..h0.len()).map(|k| val(k + 13, 1.0)).collect();
            let run = |x: &[f64], w: &[f64], h0: &[f64], c0: &[f64]| {
                let mut y = vec![0.0; g.y_len()];
                let mut hy = vec![0.0; h0.len()];
                let mut cy = vec![0.0; c0.len()];
                let mut res = vec![0.0; g.reserve_len()];
                let mut inner_in: Vec<f64> = Vec::new();
                for l in 0..layers {
                    let mut yl = vec![0.0; g.y_len()];
                    for d in 0..dirs {
                        let k = l * dirs + d;
                        let xs: &[f64] = if l == 0 { x } else { &inner_in };
                        let (hs, cs) = (
                            k * g.n * g.ho()..(k + 1) * g.n * g.ho(),
                            if lstm { k * g.n * g.h..(k + 1) * g.n * g.h } else { 0..0 },
                        );
                        forward_dir(
                            &g,
                            &Cell::of(&g, w, l, d),
                            g.input(l),
                            d,
                            xs,
                            &h0[hs.clone()],
                            &c0[cs.clone()],
                            &mut yl,
                            &mut res[k * g.cell_len()..(k + 1) * g.cell_len()],
                            &mut hy[hs],
                            &mut cy[cs],
                        );
                    }
                    if l + 1 < layers {
                        let off = g.inner_off(l);
                        res[off..off + g.y_len()].copy_from_slice(&yl);
                        inner_in = yl;
                    } else {
                        y = yl;
                    }
                }
                let loss: f64 = y.iter().zip(&u).map(|(a, b)| a * b).sum::<f64>()
                    + hy.iter().zip(&uh).map(|(a, b)| a * b).sum::<f64>();
                (loss, y, res)
            };
            let (_, y, res) = run(&x, &w, &h0, &c0);
            // The backward pass, driven as the operator drives it.
            let mut dx = vec![0.0; x.len()];
            let mut dw = vec![0.0; w.len()];
            let mut dh0 = vec![0.0; h0.len()];
            let mut dc0 = vec![0.0; c0.len()];
            let zc = vec![0.0; c0.len()];
            let mut dy = u.clone();
            for l in (0..layers).rev() {
                let xs: Vec<f64> = if l == 0 {
                    x.clone()
                } else {
                    let o = g.inner_off(l - 1);
                    res[o..o + g.y_len()].to_vec()
                };
                let yl: Vec<f64> = if l + 1 == layers {
                    y.clone()
                } else {
                    let o = g.inner_off(l);
                    res[o..o + g.y_len()].to_vec()
                };
                let mut dlx = vec![0.0; xs.len()];
                for d in 0..dirs {
                    let k = l * dirs + d;
                    let (hs, cs) = (
                        k * g.n * g.ho()..(k + 1) * g.n * g.ho(),
                        if lstm { k * g.n * g.h..(k + 1) * g.n * g.h } else { 0..0 },
                    );
                    let (wo, bo) = (g.w_off(l, d), g.b_off(l, d));
                    let (head, tail) = dw.split_at_mut(bo);
                    backward_dir(
                        &g,
                        &DirIn {
                            cell: Cell::of(&g, &w, l, d),
                            input: g.input(l),
                            d,
                            x: &xs,
                            y: &yl,
                            h0: &h0[hs.clone()],
                            c0: &c0[cs.clone()],
                            res: &res[k * g.cell_len()..(k + 1) * g.cell_len()],
                            dy: &dy,
                            dhy: &uh[hs.clone()],
                            dcy: &zc[cs.clone()],
                        },
                        DirOut {
                            dx: &mut dlx,
                            dw: &mut head[wo..wo + g.w_len(l)],
                            db: &mut tail[..2 * g.gh()],
                            dh0: &mut dh0[hs],
                            dc0: &mut dc0[cs],
                        },
                    );
                }
                if l == 0 {
                    dx = dlx
                } else {
                    dy = dlx
                }
            }
            let eps = 1e-6;
            let check = |name: &str, analytic: &[f64], numeric: &dyn Fn(usize) -> f64| {
                for k in (0..analytic.len()).step_by(analytic.len().div_ceil(40).max(1)) {
                    let num = numeric(k);
                    assert!(
                        (num - analytic[k]).abs() < 1e-6 * (1.0 + num.abs()),
                        "{mode:?} L{layers} D{dirs} P{p}: d{name}[{k}] {} vs {num}",
                        analytic[k]
                    );
                }
            };
            check("x", &dx, &|k| {
                let (mut a, mut b) = (x.clone(), x.clone());
                a[k] += eps;
                b[k] -= eps;
                (run(&a, &w, &h0, &c0).0 - run(&b, &w, &h0, &c0).0) / (2.0 * eps)
            });
            check("w", &dw, &|k| {
                let (mut a, mut b) = (w.clone(), w.clone());
                a[k] += eps;
                b[k] -= eps;
                (run(&x, &a, &h0, &c0).0 - run(&x, &b, &h0, &c0).0) / (2.0 * eps)
            });
            check("h0", &dh0, &|k| {
                let (mut a, mut b) = (h0.clone(), h0.clone());
                a[k] += eps;
                b[k] -= eps;
                (run(&x, &w, &a, &c0).0 - run(&x, &w, &b, &c0).0) / (2.0 * eps)
            });
            check("c0", &dc0, &|k| {
                let (mut a, mut b) = (c0.clone(), c0.clone());
                a[k] += eps;
                b[k] -= eps;
                (run(&x, &w, &h0, &a).0 - run(&x, &w, &h0, &b).0) / (2.0 * eps)
            });
        }
    }
}
