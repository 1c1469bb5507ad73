//! Random programs written in Linnet, the same results everywhere: each
//! program is drawn as source (index definitions, reductions, contractions
//! against parameters, gathers, slices and concatenations, permutes and
//! reshapes, bf16 rounding, lazy selects, and calls of the standard
//! library's kernels: attention and the gated delta rule), checked,
//! lowered, and run on the interpreter without fusion, on the interpreter
//! with it, and as native code. The interpreter's two runs agree bit for
//! bit; native code meets the numerics contract (`tolerance`).

use linnet_exec::tensor::{Data, Tensor};
use linnet_frontend::lower::Lowering;
use linnet_frontend::package::LoadOptions;
use linnet_ir::Dtype;
use linnet_runtime::sampling::Rng;
use linnet_runtime::BackendKind;
use std::path::PathBuf;

mod common;

use common::{machine_on, root};

struct Program {
    rng: Rng,
    lines: Vec<String>,
    /// Names of `[N, H; f32]` values defined so far.
    values: Vec<String>,
}

impl Program {
    fn pick(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }

    fn any(&mut self) -> String {
        let at = self.pick(self.values.len());
        self.values[at].clone()
    }

    fn constant(&mut self) -> String {
        format!("{:.3}", (self.rng.next_f64() - 0.5) * 4.0)
    }

    /// An f32 element expression at `[n, h]` over the values so far.
    fn element(&mut self, depth: u32) -> String {
        if depth == 0 || self.pick(3) == 0 {
            return match self.pick(4) {
                0 => self.constant(),
                _ => format!("{}[n, h]", self.any()),
            };
        }
        let (a, b) = (self.element(depth - 1), self.element(depth - 1));
        match self.pick(9) {
            0 => format!("({a} + {b})"),
            1 => format!("({a} - {b})"),
            2 => format!("({a} * {b})"),
            3 => format!("({a} / (1.5 + abs({b})))"),
            4 => format!("max({a}, {b})"),
            5 => format!("exp(min({a}, 4.0))"),
            6 => format!("cast<f32>(cast<bf16>({a}))"),
            7 => format!("(if {a} > {b} {{ {a} }} else {{ {b} * 0.5 }})"),
            _ => format!("tanh({a})"),
        }
    }

    /// One statement defining a new `[N, H; f32]` value.
    fn statement(&mut self) {
        let name = format!("t{}", self.values.len());
        let (a, b) = (self.any(), self.any());
        let line = match self.pick(11) {
            0..=2 => format!("let {name}[n, h] = {a}[n, h] * {}", self.element(3)),
            3 => format!("let {name}[n, h] = sum<f32>[k] {a}[n, k] * cast<f32>(w[h, k])"),
            4 => {
                let reduction = ["sum", "max", "min"][self.pick(3)];
                self.lines.push(format!("let {name}_r[n] = {reduction}[h] {a}[n, h]"));
                format!("let {name}[n, h] = {b}[n, h] * {name}_r[n] / 8.0")
            }
            5 => format!("let {name}[n, h] = {a}[cast<i64>(idx[n]), h] + cast<f32>(v[cast<i64>(idx[n])])"),
            6 => format!("let {name} = concat({a}[:, 1:H], {b}[:, 0:1], axis = 1)"),
            7 => format!("let {name} = permute(permute({a}, [1, 0]) * 0.5, [1, 0])"),
            8 => {
                self.lines.push(format!("let {name}_q = reshape({a}, [1, 1, N, H])"));
                self.lines.push(format!("let {name}_k = reshape({b}, [1, 1, N, H])"));
                self.lines.push(format!(
                    "let {name}_a = grouped_attention({name}_q, {name}_k, {name}_k, 0.25, some(causal_mask<N, N>()))"
                ));
                format!("let {name} = reshape({name}_a, [N, H])")
            }
            9 => {
                self.lines.push(format!("let {name}_x = reshape({a}, [N, 1, H])"));
                self.lines.push(format!("let {name}_g[n, g] = 1.0 / (1.0 + exp(-{b}[n, g]))"));
                self.lines.push(format!("let {name}_s = fill<f32>([N, 1, H, H], 0.0)"));
                self.lines.push(format!(
                    "let {name}_d = gated_delta_step({name}_x, {name}_x, {name}_x, {name}_g[:, 0:1], {name}_g[:, 1:2], {name}_s, 0.5)"
                ));
                format!("let {name}[n, h] = {name}_d[n, 0, 0, h]")
            }
            _ => format!("let {name}[n, h] = cast<f32>(cast<bf16>({a}[n, h] * {}))", self.constant()),
        };
        self.lines.push(line);
        self.values.push(name);
    }

    fn source(seed: u64) -> String {
        let mut program = Program { rng: Rng::new(seed), lines: Vec::new(), values: vec!["x".into()] };
        let statements = 3 + program.pick(6);
        for _ in 0..statements {
            program.statement();
        }
        let result = program.values.last().cloned().expect("a statement");
        let body: Vec<String> = program.lines.iter().map(|line| format!("        {line}")).collect();
        format!(
            "module fuzz\n\nuse std.nn.attention::{{grouped_attention, causal_mask}}\nuse std.nn.recurrent::{{gated_delta_step}}\n\n\
             pub block Prog<H: Dim, T: Float>\nwhere\n    H > 1\n{{\n    param w: Tensor[H, H; T]\n    param v: Tensor[H; T]\n\n    \
             pub entry run<N: Dim>(x: Tensor[N, H; f32], idx: Tensor[N; i32]) -> Tensor[N, H; f32]\n    where N > 0 {{\n{}\n        return {result}\n    }}\n}}\n",
            body.join("\n")
        )
    }
}

/// Program `seed`'s package, in a folder of its own for `backend`'s run.
fn package(seed: u64, source: &str, backend: BackendKind) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("linnet-programs-{}-{backend:?}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("linnet.toml"), "[package]\nname = \"fuzz\"\nversion = \"0.1.0\"\nlanguage = \"0.1\"\n")
        .unwrap();
    let dtype = if seed.is_multiple_of(2) { "f32" } else { "bf16" };
    let nest = format!("[model]\nname = \"fuzz\"\n\n[source]\npath = \"src/lib.linnet\"\nroot = \"Prog\"\nentry = \"run\"\n\n[generics]\nH = 8\nT = \"{dtype}\"\n");
    std::fs::write(dir.join("nest.toml"), nest).unwrap();
    std::fs::write(dir.join("src/lib.linnet"), source).unwrap();
    dir
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => {
            x.len() == y.len()
                && x.iter().zip(y.iter()).all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
        }
        _ => a == b,
    }
}

/// Each of 200 random programs: fused and unfused alike on the
/// interpreter, bit for bit, and within the contract compiled.
fn random_linnet_programs_agree_everywhere(backend: BackendKind) {
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    for seed in 0..200u64 {
        let source = Program::source(seed);
        let dir = package(seed, &source, backend);
        let model = |lowering: Lowering| {
            let (model, _) =
                linnet_frontend::driver::lower_package_with(&dir, &options, lowering).unwrap_or_else(|checked| {
                    let mut out = Vec::new();
                    linnet_frontend::diagnostic::render_human(&checked.diagnostics, &checked.sources, false, &mut out)
                        .unwrap();
                    panic!("program {seed} does not build:\n{source}\n{}", String::from_utf8_lossy(&out))
                });
            let params = linnet_runtime::random::params(&model, seed).expect("the parameters fit in memory");
            (model, params)
        };
        let reference_machine = |lowering| {
            let (model, params) = model(lowering);
            linnet_exec::interp::machine(model, params)
        };
        let mut rng = Rng::new(seed ^ 0xfeed);
        let rows = 1 + (rng.next_u64() % 5) as usize;
        let x = Tensor::from_f32(
            Dtype::F32,
            vec![rows, 8],
            (0..rows * 8).map(|_| (rng.next_f64() * 4.0 - 2.0) as f32).collect(),
        );
        let idx = Tensor::from_i64(
            Dtype::I32,
            vec![rows],
            (0..rows).map(|_| (rng.next_u64() % rows as u64) as i64).collect(),
        );
        let inputs = vec![x, idx];
        let reference = reference_machine(Lowering { optimize: false, ..Lowering::default() })
            .call("run", inputs.clone())
            .unwrap()
            .remove(0);
        let fused = reference_machine(Lowering::default()).call("run", inputs.clone()).unwrap().remove(0);
        let (fused_model, params) = model(Lowering::default());
        let native = machine_on(backend, fused_model, params).call("run", inputs).unwrap().remove(0);
        assert!(same(&fused, &reference), "program {seed}: fusion changed the result\n{source}");
        if let Err(mismatch) = linnet_exec::tolerance::compare(&reference, &native) {
            panic!("program {seed}: native code breaks the contract: {mismatch}\n{source}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Literals fold as the program computes at run time (`numerics`):
/// integers in i64 with Euclidean division and remainder, by zero giving
/// 0, so a literal `5 / 0` checks, lowers and runs on both backends.
fn integer_literals_fold_as_the_runtime_divides(backend: BackendKind) {
    let source = "module fuzz\n\npub block Prog<H: Dim, T: Float>\nwhere\n    H > 1\n{\n    param w: Tensor[H, H; T]\n    param v: Tensor[H; T]\n\n    \
                  pub entry run<N: Dim>(x: Tensor[N, H; f32], idx: Tensor[N; i32]) -> Tensor[N; i32]\n    where N > 0 {\n        \
                  let folded[n] = idx[n] * (7 / 2) + (0 - 7) / 2 + 5 / 0 + (0 - 7) % 3 + 9 % 0\n        return folded\n    }\n}\n";
    let dir = package(9_000, source, backend);
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    let (model, _) = linnet_frontend::driver::lower_package_with(&dir, &options, Lowering::default())
        .unwrap_or_else(|_| panic!("lowers"));
    let params = linnet_runtime::random::params(&model, 1).expect("the parameters fit in memory");
    let x = Tensor::from_f32(Dtype::F32, vec![3, 8], vec![0.0; 24]);
    let idx = Tensor::from_i64(Dtype::I32, vec![3], vec![0, 1, -2]);
    // 3·idx − 4 + 0 + 2 + 0
    let expected = Tensor::from_i64(Dtype::I32, vec![3], vec![-2, 1, -8]);
    let interpreted = linnet_exec::interp::machine(model.clone(), params.clone())
        .call("run", vec![x.clone(), idx.clone()])
        .unwrap()
        .remove(0);
    let native = machine_on(backend, model, params).call("run", vec![x, idx]).unwrap().remove(0);
    assert_eq!((interpreted, native), (expected.clone(), expected));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A reduction to a scalar lowers as an index definition without indices,
/// and an assertion names the block instance it failed in: the check of a
/// sub in an array says which element, on the interpreter and natively.
fn a_scalar_reduction_and_an_assertion_that_names_its_instance(backend: BackendKind) {
    let source = "module fuzz\n\nblock Check<H: Dim, T: Float> {\n    param v: Tensor[H; T]\n\n    \
                  pub fn total<N: Dim>(x: Tensor[N, H; f32]) -> f32 {\n        \
                  let sum_all = sum[n] sum[h] x[n, h] * cast<f32>(v[h])\n        \
                  assert(sum_all < 100.0, \"the total is too large\")\n        return sum_all\n    }\n}\n\n\
                  pub block Prog<H: Dim, T: Float> {\n    sub checks: [Check<H, T>; 2]\n\n    \
                  pub entry run<N: Dim>(x: Tensor[N, H; f32]) -> f32 {\n        var total = cast<f32>(0.0)\n        \
                  static for check in checks {\n            total = total + check.total(x)\n        }\n        return total\n    }\n}\n";
    let dir = package(9_002, source, backend);
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    let (model, _) = linnet_frontend::driver::lower_package_with(&dir, &options, Lowering::default())
        .unwrap_or_else(|checked| panic!("lowers: {:?}", checked.diagnostics));
    let ones = |dtype, len| Tensor::from_f32(dtype, vec![len], vec![1.0; len]);
    let t = model.params[0].dtype;
    let params = vec![ones(t, 8), ones(t, 8)];
    let small = Tensor::from_f32(Dtype::F32, vec![2, 8], vec![0.5; 16]);
    let large = Tensor::from_f32(Dtype::F32, vec![2, 8], vec![10.0; 16]);
    let mut interpreted = linnet_exec::interp::machine(model.clone(), params.clone());
    let mut native = machine_on(backend, model, params);
    let sum = Tensor::from_f32(Dtype::F32, vec![], vec![16.0]);
    assert_eq!(interpreted.call("run", vec![small.clone()]).unwrap().remove(0), sum);
    assert_eq!(native.call("run", vec![small]).unwrap().remove(0), sum);
    for error in [interpreted.call("run", vec![large.clone()]), native.call("run", vec![large])] {
        let error = error.unwrap_err().to_string();
        assert!(error.contains("the total is too large (in `checks.0`)"), "{error}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A select whose branch reads at a position the lanes compute one by one
/// (`(h - 0) + 1`, no unit stride), outside its value in the last lane:
/// those four positions go to the scalar code, which must start at the
/// first of them (it once started at the failing lane's, and stored each
/// element three positions late). Found by the random programs once views
/// were read through into such selects.
fn a_load_outside_its_value_in_a_lane_by_lane_branch_falls_back_from_the_first_lane(backend: BackendKind) {
    let source = "module fuzz\n\npub block Prog<H: Dim, T: Float>\nwhere\n    H > 1\n{\n    param w: Tensor[H, H; T]\n\n    \
                  pub entry run<N: Dim>(x: Tensor[N, H; f32], idx: Tensor[N; i32]) -> Tensor[N, H; f32]\n    where N > 0 {\n        \
                  let a[n, h] = x[n, h] * 2.0\n        \
                  let t[n, h] = x[n, h] * (if h < 7 { a[n, (h - 0) + 1] } else { x[n, 0] })\n        return t\n    }\n}\n";
    let dir = package(9_001, source, backend);
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    let (model, _) = linnet_frontend::driver::lower_package_with(&dir, &options, Lowering::default())
        .unwrap_or_else(|_| panic!("lowers"));
    let params = linnet_runtime::random::params(&model, 1).expect("the parameters fit in memory");
    let row: Vec<f32> = (1..=8).map(|h| h as f32).collect();
    let x = Tensor::from_f32(Dtype::F32, vec![2, 8], [row.clone(), row].concat());
    let idx = Tensor::from_i64(Dtype::I32, vec![2], vec![0, 1]);
    // x[h] · 2·x[h + 1], and x[7] · x[0] in the last column.
    let expected_row: Vec<f32> = (1..=8).map(|h| if h < 8 { h as f32 * 2.0 * (h + 1) as f32 } else { 8.0 }).collect();
    let expected = Tensor::from_f32(Dtype::F32, vec![2, 8], [expected_row.clone(), expected_row].concat());
    let interpreted = linnet_exec::interp::machine(model.clone(), params.clone())
        .call("run", vec![x.clone(), idx.clone()])
        .unwrap()
        .remove(0);
    let native = machine_on(backend, model, params).call("run", vec![x, idx]).unwrap().remove(0);
    assert_eq!((interpreted, native), (expected.clone(), expected));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A trait's default method, reached through a bound, runs with the given
/// block's own functions: `twice` (a default) calls `scale` (each block's)
/// and `offset` (a default `Doubler` overrides); `Tripler` overrides
/// `twice` itself. The blocks name their width otherwise than the trait.
fn a_trait_default_runs_the_given_blocks_functions(backend: BackendKind) {
    let source = "module fuzz\n\n\
                  trait Scaler<H: Dim> {\n    fn scale<N: Dim>(x: Tensor[N, H; f32]) -> Tensor[N, H; f32]\n\n    \
                  fn twice<N: Dim>(x: Tensor[N, H; f32]) -> Tensor[N, H; f32] {\n        return scale(scale(x)) + offset(x)\n    }\n\n    \
                  fn offset<N: Dim>(x: Tensor[N, H; f32]) -> Tensor[N, H; f32] {\n        return x * 0.0\n    }\n}\n\n\
                  block Doubler<Width: Dim> {\n    pub fn scale<N: Dim>(x: Tensor[N, Width; f32]) -> Tensor[N, Width; f32] {\n        return x * 2.0\n    }\n\n    \
                  pub fn offset<N: Dim>(x: Tensor[N, Width; f32]) -> Tensor[N, Width; f32] {\n        return x\n    }\n}\n\n\
                  block Tripler<Width: Dim> {\n    pub fn scale<N: Dim>(x: Tensor[N, Width; f32]) -> Tensor[N, Width; f32] {\n        return x * 3.0\n    }\n\n    \
                  pub fn twice<N: Dim>(x: Tensor[N, Width; f32]) -> Tensor[N, Width; f32] {\n        return x * 100.0\n    }\n}\n\n\
                  block Pair<H: Dim, A: Scaler<H>, B: Scaler<H>> {\n    sub a: A\n    sub b: B\n\n    \
                  pub fn run<N: Dim>(x: Tensor[N, H; f32]) -> Tensor[N, H; f32] {\n        return a.twice(x) + b.twice(x)\n    }\n}\n\n\
                  pub block Prog<H: Dim, T: Float> {\n    sub pair: Pair<H, Doubler<H>, Tripler<H>>\n\n    \
                  pub entry run<N: Dim>(x: Tensor[N, H; f32]) -> Tensor[N, H; f32] {\n        return pair.run(x)\n    }\n}\n";
    let dir = package(9_003, source, backend);
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    let (model, _) = linnet_frontend::driver::lower_package_with(&dir, &options, Lowering::default())
        .unwrap_or_else(|checked| panic!("lowers: {:?}", checked.diagnostics));
    let x = Tensor::from_f32(Dtype::F32, vec![2, 8], (0..16).map(|i| i as f32).collect());
    // Doubler: 2·2·x + x; Tripler: its own 100·x.
    let expected = Tensor::from_f32(Dtype::F32, vec![2, 8], (0..16).map(|i| 105.0 * i as f32).collect());
    let interpreted = linnet_exec::interp::machine(model.clone(), Vec::new()).call("run", vec![x.clone()]).unwrap();
    let native = machine_on(backend, model, Vec::new()).call("run", vec![x]).unwrap();
    assert_eq!((interpreted, native), (vec![expected.clone()], vec![expected]));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The decoder's hooks in the standard library compute what they say: a
/// soft-capped head is `Cap · tanh(x·Wᵀ / Cap)` of the plain product, and
/// learned positions add the row of each token's position.
fn the_decoders_hooks_compute_what_they_say(backend: BackendKind) {
    let source = "module fuzz\n\nuse std.nn.embedding::{PositionalEmbedding}\n\
                  use std.nn.linear::{Linear, SoftcappedLinear}\n\n\
                  pub block Prog<H: Dim, T: Float> {\n    sub plain: Linear<H, H, f32>\n    sub capped: SoftcappedLinear<H, H, f32, 2.0>\n    \
                  sub embed: PositionalEmbedding<4, H, 6, f32>\n\n    \
                  pub entry run<N: Dim>(x: Tensor[N, H; f32], tokens: Tensor[1, N; i32], at: Tensor[1, N; i64]) -> (Tensor[N, H; f32], Tensor[N, H; f32], Tensor[1, N, H; f32]) {\n        \
                  return (plain.forward(x), capped.forward(x), embed.at(tokens, at))\n    }\n}\n";
    let dir = package(9_004, source, backend);
    let options = LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() };
    let (model, _) = linnet_frontend::driver::lower_package_with(&dir, &options, Lowering::default())
        .unwrap_or_else(|checked| panic!("lowers: {:?}", checked.diagnostics));
    let mut rng = Rng::new(11);
    let mut draw = |shape: Vec<usize>, scale: f64| {
        let count = shape.iter().product();
        Tensor::from_f32(Dtype::F32, shape, (0..count).map(|_| ((rng.next_f64() - 0.5) * scale) as f32).collect())
    };
    // The two heads share their weight; the table and positions are `[4, 8]` and `[6, 8]`.
    let weight = draw(vec![8, 8], 4.0);
    let params = vec![weight.clone(), weight, draw(vec![4, 8], 1.0), draw(vec![6, 8], 1.0)];
    let x = draw(vec![3, 8], 4.0);
    let tokens = Tensor::from_i64(Dtype::I32, vec![1, 3], vec![3, 0, 3]);
    let at = Tensor::from_i64(Dtype::I64, vec![1, 3], vec![5, 1, 0]);
    let inputs = vec![x, tokens, at];
    for outputs in [
        linnet_exec::interp::machine(model.clone(), params.clone()).call("run", inputs.clone()).unwrap(),
        machine_on(backend, model.clone(), params.clone()).call("run", inputs.clone()).unwrap(),
    ] {
        let (plain, capped) = (outputs[0].as_f32().unwrap(), outputs[1].as_f32().unwrap());
        for (p, c) in plain.iter().zip(capped) {
            let expected = 2.0 * (f64::from(*p) / 2.0).tanh();
            assert!((f64::from(*c) - expected).abs() < 1e-6, "{c} against 2·tanh({p}/2)");
        }
        assert!(plain.iter().any(|p| p.abs() > 2.0), "some logits are past the cap");
        let (table, positions) = (params[2].as_f32().unwrap(), params[3].as_f32().unwrap());
        let rows = outputs[2].as_f32().unwrap();
        for (n, (token, position)) in [(3, 5), (0, 1), (3, 0)].into_iter().enumerate() {
            for h in 0..8 {
                assert_eq!(rows[n * 8 + h], table[token * 8 + h] + positions[position * 8 + h], "row {n}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The suite, once per compiled backend.
macro_rules! programs {
    ($name:ident, $backend:expr) => {
        mod $name {
            #[test]
            fn random_linnet_programs_agree_everywhere() {
                super::random_linnet_programs_agree_everywhere($backend);
            }

            #[test]
            fn integer_literals_fold_as_the_runtime_divides() {
                super::integer_literals_fold_as_the_runtime_divides($backend);
            }

            #[test]
            fn a_scalar_reduction_and_an_assertion_that_names_its_instance() {
                super::a_scalar_reduction_and_an_assertion_that_names_its_instance($backend);
            }

            #[test]
            fn the_decoders_hooks_compute_what_they_say() {
                super::the_decoders_hooks_compute_what_they_say($backend);
            }

            #[test]
            fn a_trait_default_runs_the_given_blocks_functions() {
                super::a_trait_default_runs_the_given_blocks_functions($backend);
            }

            #[test]
            fn a_load_outside_its_value_in_a_lane_by_lane_branch_falls_back_from_the_first_lane() {
                super::a_load_outside_its_value_in_a_lane_by_lane_branch_falls_back_from_the_first_lane($backend);
            }
        }
    };
}

common::for_each_compiled_backend!(programs);
