//! Quantized parameters read where they lie: a parameter stored in a
//! block format (`Param::storage`) is its blocks' bytes, a `memref<?xi8>`,
//! and a kernel reading its elements decodes them in registers, never
//! into memory. [`Emitter::decoded`] gives `width` consecutive values
//! from a flat element index as f32s (a register, or a vector of them):
//! the block's scales are read once for the run, its quants as one
//! vector of bytes. The arithmetic is `quant::value_at`'s, operation for
//! operation (`d · q` for Q8_0, `(d · scale) · q − dmin · min` for Q4_K,
//! `(d · scale) · level` for Q6_K, unfused), so the values are exactly
//! the reference interpreter's.
//!
//! A run never crosses a block: its first element is a multiple of its
//! width, which divides 32 (a contraction's runs of eight, or single
//! elements), and every format's groups are 16 or 32 values of a row
//! that is whole blocks.

use super::emit::Emitter;
use linnet_ir::quant::BlockFormat;

/// MLIR types of a run of `width` values: scalars for one.
struct Run {
    width: usize,
}

impl Run {
    fn of(&self, element: &str) -> String {
        match self.width {
            1 => element.to_string(),
            width => format!("vector<{width}x{element}>"),
        }
    }

    /// An integer or float constant of every element of the run.
    fn constant(&self, value: &str, element: &str) -> String {
        match self.width {
            1 => format!("arith.constant {value} : {element}"),
            _ => format!("arith.constant dense<{value}> : {}", self.of(element)),
        }
    }
}

impl Emitter<'_> {
    /// Values `at..at + width` (`at` an index, a multiple of `width`,
    /// which divides 32) of `argument`, a parameter stored in blocks of
    /// `format`, as f32: a register for one value, else a vector.
    pub fn decoded(&mut self, argument: &str, at: &str, format: BlockFormat, width: usize) -> String {
        assert!(32 % width == 0, "a run of {width} values may cross a block");
        let run = Run { width };
        let values = self.index_constant(format.block_values() as i64);
        let block = self.op(format!("arith.divui {at}, {values} : index"));
        let within = self.op(format!("arith.remui {at}, {values} : index"));
        let size = self.index_constant(format.block_bytes() as i64);
        let base = self.mul(&block, &size);
        match format {
            BlockFormat::Q8_0 => {
                let d = self.half_at(argument, &base, 0);
                let at = self.byte_index(&base, 2, &within);
                let quants = self.run_bytes(argument, &at, &run);
                let quants = self.op(format!("arith.sitofp {quants} : {} to {}", run.of("i8"), run.of("f32")));
                let d = self.splat(&d, &run);
                self.op(format!("arith.mulf {d}, {quants} : {}", run.of("f32")))
            }
            BlockFormat::Q4K => self.q4_k(argument, &base, &within, &run),
            BlockFormat::Q6K => self.q6_k(argument, &base, &within, &run),
        }
    }

    /// Q4_K: 32-value group `within / 32` has a 6-bit scale and min
    /// (`quant::q4_k_scales_mins`' packing); its nibbles are the low (even
    /// group) or high (odd) halves of 32 bytes shared by a pair of groups.
    fn q4_k(&mut self, argument: &str, base: &str, within: &str, run: &Run) -> String {
        let (d, dmin) = (self.half_at(argument, base, 0), self.half_at(argument, base, 2));
        let thirty_two = self.index_constant(32);
        let group = self.op(format!("arith.divui {within}, {thirty_two} : index"));
        let (four, eight) = (self.index_constant(4), self.index_constant(8));
        // Bytes `group`, `group + 4` and `group % 4` of the packed twelve
        // (which start at byte 4).
        let group_byte = self.add(&group, &four);
        let a = self.byte_at(argument, base, &group_byte);
        let min_byte = self.add(&group, &eight);
        let b = self.byte_at(argument, base, &min_byte);
        let quarter = self.op(format!("arith.remui {group}, {four} : index"));
        let top_byte = self.add(&quarter, &four);
        let c = self.byte_at(argument, base, &top_byte);
        let int = |e: &mut Self, value: i64| e.op(format!("arith.constant {value} : i32"));
        let (six, fifteen, sixty_three, four_bits) = (int(self, 6), int(self, 15), int(self, 63), int(self, 4));
        let low_scale = self.op(format!("arith.andi {a}, {sixty_three} : i32"));
        let low_min = self.op(format!("arith.andi {b}, {sixty_three} : i32"));
        let high_scale = {
            let low = self.op(format!("arith.andi {b}, {fifteen} : i32"));
            let top = self.op(format!("arith.shrui {c}, {six} : i32"));
            let top = self.op(format!("arith.shli {top}, {four_bits} : i32"));
            self.op(format!("arith.ori {low}, {top} : i32"))
        };
        let high_min = {
            let low = self.op(format!("arith.shrui {b}, {four_bits} : i32"));
            let top = self.op(format!("arith.shrui {a}, {six} : i32"));
            let top = self.op(format!("arith.shli {top}, {four_bits} : i32"));
            self.op(format!("arith.ori {low}, {top} : i32"))
        };
        let first_four = self.op(format!("arith.cmpi ult, {group}, {four} : index"));
        let scale = self.op(format!("arith.select {first_four}, {low_scale}, {high_scale} : i32"));
        let min = self.op(format!("arith.select {first_four}, {low_min}, {high_min} : i32"));
        let scale = self.op(format!("arith.uitofp {scale} : i32 to f32"));
        let min = self.op(format!("arith.uitofp {min} : i32 to f32"));
        let step = self.op(format!("arith.mulf {d}, {scale} : f32"));
        let offset = self.op(format!("arith.mulf {dmin}, {min} : f32"));
        // Group `g`'s nibbles: bytes `32 · (g / 2) + within % 32`, shifted
        // by `4 · (g % 2)`.
        let two = self.index_constant(2);
        let pair = self.op(format!("arith.divui {group}, {two} : index"));
        let pair_start = self.mul(&pair, &thirty_two);
        let l = self.op(format!("arith.remui {within}, {thirty_two} : index"));
        let byte = self.add(&pair_start, &l);
        let odd = self.op(format!("arith.remui {group}, {two} : index"));
        let shift = self.mul(&odd, &four);
        let at = self.byte_index(base, 16, &byte);
        let nibbles = self.bits_of(argument, &at, &shift, 15, run);
        let quants = self.op(format!("arith.uitofp {nibbles} : {} to {}", run.of("i8"), run.of("f32")));
        let (step, offset) = (self.splat(&step, run), self.splat(&offset, run));
        let scaled = self.op(format!("arith.mulf {step}, {quants} : {}", run.of("f32")));
        self.op(format!("arith.subf {scaled}, {offset} : {}", run.of("f32")))
    }

    /// Q6_K: each half block of 128 values has 64 bytes of low nibbles
    /// and 32 of high bit pairs (`quant::q6_k_level`); a 16-value group's
    /// scale is an `i8`, the block's `d` an f16 at its end.
    fn q6_k(&mut self, argument: &str, base: &str, within: &str, run: &Run) -> String {
        let (half_values, quarter_values) = (self.index_constant(128), self.index_constant(32));
        let half = self.op(format!("arith.divui {within}, {half_values} : index"));
        let rest = self.op(format!("arith.remui {within}, {half_values} : index"));
        let quarter = self.op(format!("arith.divui {rest}, {quarter_values} : index"));
        let l = self.op(format!("arith.remui {rest}, {quarter_values} : index"));
        let (two, four, sixty_four) = (self.index_constant(2), self.index_constant(4), self.index_constant(64));
        // Low nibbles: byte `64 · half + l + 32 · (quarter % 2)`, shifted
        // by `4 · (quarter / 2)`.
        let low_half = self.mul(&half, &sixty_four);
        let odd = self.op(format!("arith.remui {quarter}, {two} : index"));
        let odd_start = self.mul(&odd, &quarter_values);
        let low_byte = self.add(&low_half, &odd_start);
        let low_byte = self.add(&low_byte, &l);
        let upper = self.op(format!("arith.divui {quarter}, {two} : index"));
        let low_shift = self.mul(&upper, &four);
        let at = self.byte_index(base, 0, &low_byte);
        let low = self.bits_of(argument, &at, &low_shift, 15, run);
        // High pairs: byte `128 + 32 · half + l`, shifted by `2 · quarter`.
        let high_half = self.mul(&half, &quarter_values);
        let high_byte = self.add(&high_half, &l);
        let high_shift = self.mul(&quarter, &two);
        let at = self.byte_index(base, 128, &high_byte);
        let high = self.bits_of(argument, &at, &high_shift, 3, run);
        let i8s = run.of("i8");
        let four_bits = self.op(run.constant("4", "i8"));
        let high = self.op(format!("arith.shli {high}, {four_bits} : {i8s}"));
        let level = self.op(format!("arith.ori {low}, {high} : {i8s}"));
        let thirty_two = self.op(run.constant("32", "i8"));
        let level = self.op(format!("arith.subi {level}, {thirty_two} : {i8s}"));
        let level = self.op(format!("arith.sitofp {level} : {i8s} to {}", run.of("f32")));
        let sixteen = self.index_constant(16);
        let group = self.op(format!("arith.divui {within}, {sixteen} : index"));
        let scales = self.index_constant(192);
        let scale_byte = self.add(&group, &scales);
        let scale = self.load_byte(argument, base, &scale_byte);
        let scale = self.op(format!("arith.sitofp {scale} : i8 to f32"));
        let d = self.half_at(argument, base, 208);
        let step = self.op(format!("arith.mulf {d}, {scale} : f32"));
        let step = self.splat(&step, run);
        self.op(format!("arith.mulf {step}, {level} : {}", run.of("f32")))
    }

    /// The byte at `base + offset` (an index), as stored (`i8`).
    fn load_byte(&mut self, argument: &str, base: &str, offset: &str) -> String {
        let at = self.add(base, offset);
        self.op(format!("memref.load {argument}[{at}] : memref<?xi8>"))
    }

    /// The byte at `base + offset`, zero-extended to `i32`.
    fn byte_at(&mut self, argument: &str, base: &str, offset: &str) -> String {
        let byte = self.load_byte(argument, base, offset);
        self.op(format!("arith.extui {byte} : i8 to i32"))
    }

    /// The f16 at byte `base + offset` (little-endian), as f32.
    fn half_at(&mut self, argument: &str, base: &str, offset: i64) -> String {
        let halves = |e: &mut Self, byte: i64| {
            let at = e.index_constant(offset + byte);
            let byte = e.load_byte(argument, base, &at);
            e.op(format!("arith.extui {byte} : i8 to i16"))
        };
        let (low, high) = (halves(self, 0), halves(self, 1));
        let eight = self.op("arith.constant 8 : i16".into());
        let high = self.op(format!("arith.shli {high}, {eight} : i16"));
        let bits = self.op(format!("arith.ori {low}, {high} : i16"));
        let half = self.op(format!("arith.bitcast {bits} : i16 to f16"));
        self.op(format!("arith.extf {half} : f16 to f32"))
    }

    /// `base + start + offset` (`offset` an index).
    fn byte_index(&mut self, base: &str, start: i64, offset: &str) -> String {
        let start = self.index_constant(start);
        let first = self.add(base, &start);
        self.add(&first, offset)
    }

    /// The run's bytes from byte `at`.
    fn run_bytes(&mut self, argument: &str, at: &str, run: &Run) -> String {
        match run.width {
            1 => self.op(format!("memref.load {argument}[{at}] : memref<?xi8>")),
            _ => self.op(format!("vector.load {argument}[{at}] : memref<?xi8>, {}", run.of("i8"))),
        }
    }

    /// The run's bytes from byte `at`, shifted right by `shift` (an index)
    /// and masked to `mask`.
    fn bits_of(&mut self, argument: &str, at: &str, shift: &str, mask: u8, run: &Run) -> String {
        let bytes = self.run_bytes(argument, at, run);
        let shift = self.op(format!("arith.index_cast {shift} : index to i8"));
        let shift = self.splat_as(&shift, "i8", run);
        let i8s = run.of("i8");
        let shifted = self.op(format!("arith.shrui {bytes}, {shift} : {i8s}"));
        let mask = self.op(run.constant(&mask.to_string(), "i8"));
        self.op(format!("arith.andi {shifted}, {mask} : {i8s}"))
    }

    /// An f32 register as every element of the run.
    fn splat(&mut self, value: &str, run: &Run) -> String {
        self.splat_as(value, "f32", run)
    }

    fn splat_as(&mut self, value: &str, element: &str, run: &Run) -> String {
        match run.width {
            1 => value.to_string(),
            _ => self.op(format!("vector.broadcast {value} : {element} to {}", run.of(element))),
        }
    }
}
