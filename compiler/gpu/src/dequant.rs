//! Quantized parameters read where they lie: a parameter stored in a
//! block format (`Param::storage`) is its blocks' bytes, a `memref<?xi8>`,
//! and a kernel reading its elements decodes them in registers, never
//! into memory. [`Emitter::decoded`] gives `width` consecutive values
//! from a flat element index as f32s (a register, or a vector of them):
//! the block's scales are read once for the run, its quants as one
//! vector of bytes. The arithmetic is `quant::value_at`'s, operation for
//! operation: a run's levels (`quant::layouts::level`), times its group's
//! step, its offset added or subtracted where the format has one
//! (`quant::layouts::group_scale`), so the values are exactly the
//! reference interpreter's. (Where the offset is added the product is
//! exact in every format, so a backend that fuses the two rounds alike.)
//! Q8_0, Q4_K and Q6_K read their levels and scales in one piece; the
//! other formats through [`Emitter::levels`] and [`Emitter::group_scale`].
//!
//! A run never crosses a group: its first element is a multiple of its
//! width, which divides 16 (a contraction's runs of eight, or single
//! elements), and every format's groups, and the halves of its runs of 32
//! nibbles, are 16 or 32 values of a row that is whole blocks.

use super::emit::Emitter;
use linnet_ir::quant::{layouts, BlockFormat};

/// What a group adds to its scaled levels (an f32 register), as
/// `quant::Offset` says.
enum Added {
    None,
    Plus(String),
    Minus(String),
}

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
    /// which divides 16) of `argument`, a parameter stored in blocks of
    /// `format`, as f32: a register for one value, else a vector.
    pub fn decoded(&mut self, argument: &str, at: &str, format: BlockFormat, width: usize) -> String {
        assert!(16 % width == 0, "a run of {width} values may cross a group");
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
            _ => {
                let levels = self.levels(format, argument, &base, &within, &run);
                let levels = self.op(format!("arith.sitofp {levels} : {} to {}", run.of("i8"), run.of("f32")));
                let group_values = self.index_constant(format.group_values() as i64);
                let group = self.op(format!("arith.divui {within}, {group_values} : index"));
                let (step, offset) = self.group_scale(format, argument, &base, &group);
                let step = self.splat(&step, &run);
                let scaled = self.op(format!("arith.mulf {step}, {levels} : {}", run.of("f32")));
                match offset {
                    Added::None => scaled,
                    Added::Plus(offset) => {
                        let offset = self.splat(&offset, &run);
                        self.op(format!("arith.addf {scaled}, {offset} : {}", run.of("f32")))
                    }
                    Added::Minus(offset) => {
                        let offset = self.splat(&offset, &run);
                        self.op(format!("arith.subf {scaled}, {offset} : {}", run.of("f32")))
                    }
                }
            }
        }
    }

    /// The run's levels (`i8`s) from value `within` of the block at `base`
    /// (`quant::layouts::level`).
    fn levels(&mut self, format: BlockFormat, argument: &str, base: &str, within: &str, run: &Run) -> String {
        let i8s = run.of("i8");
        let less = |e: &mut Self, levels: String, by: i64| {
            let by = e.op(run.constant(&by.to_string(), "i8"));
            e.op(format!("arith.subi {levels}, {by} : {i8s}"))
        };
        let with_fifth_bits = |e: &mut Self, low: String, bits_at: i64| {
            let fifth = e.fifth_bits(argument, base, bits_at, within, run);
            let four = e.op(run.constant("4", "i8"));
            let fifth = e.op(format!("arith.shli {fifth}, {four} : {i8s}"));
            e.op(format!("arith.ori {low}, {fifth} : {i8s}"))
        };
        match format {
            BlockFormat::Q4_0 => {
                let nibbles = self.nibbles_of_32(argument, base, 2, within, run);
                less(self, nibbles, 8)
            }
            BlockFormat::Q4_1 => self.nibbles_of_32(argument, base, 4, within, run),
            BlockFormat::Q5_0 => {
                let low = self.nibbles_of_32(argument, base, 6, within, run);
                let levels = with_fifth_bits(self, low, 2);
                less(self, levels, 16)
            }
            BlockFormat::Q5_1 => {
                let low = self.nibbles_of_32(argument, base, 8, within, run);
                with_fifth_bits(self, low, 4)
            }
            BlockFormat::Iq4Nl => {
                let nibbles = self.nibbles_of_32(argument, base, 2, within, run);
                self.looked_up(&nibbles, &layouts::IQ4_LEVELS, run)
            }
            BlockFormat::Mxfp4 => {
                let nibbles = self.nibbles_of_32(argument, base, 1, within, run);
                self.looked_up(&nibbles, &layouts::MXFP4_LEVELS, run)
            }
            BlockFormat::Q2K => self.two_bits(argument, base, 16, within, run),
            BlockFormat::Q3K => {
                // Bit `within / 32` of bytes `within % 32`: a clear bit takes 4 off.
                let low = self.two_bits(argument, base, 32, within, run);
                let (thirty_two, two) = (self.index_constant(32), self.index_constant(2));
                let byte = self.op(format!("arith.remui {within}, {thirty_two} : index"));
                let shift = self.op(format!("arith.divui {within}, {thirty_two} : index"));
                let at = self.byte_index(base, 0, &byte);
                let high = self.bits_of(argument, &at, &shift, 1, run);
                let two = self.op(format!("arith.index_cast {two} : index to i8"));
                let two = self.splat_as(&two, "i8", run);
                let high = self.op(format!("arith.shli {high}, {two} : {i8s}"));
                let levels = self.op(format!("arith.ori {low}, {high} : {i8s}"));
                less(self, levels, 4)
            }
            BlockFormat::Q5K => {
                // Group `g`'s nibbles as Q4_K's from byte 48, its fifth
                // bits bit `g` of bytes `16 + within % 32`.
                let (thirty_two, two, four) = (self.index_constant(32), self.index_constant(2), self.index_constant(4));
                let group = self.op(format!("arith.divui {within}, {thirty_two} : index"));
                let l = self.op(format!("arith.remui {within}, {thirty_two} : index"));
                let pair = self.op(format!("arith.divui {group}, {two} : index"));
                let pair_start = self.mul(&pair, &thirty_two);
                let byte = self.add(&pair_start, &l);
                let odd = self.op(format!("arith.remui {group}, {two} : index"));
                let shift = self.mul(&odd, &four);
                let at = self.byte_index(base, 48, &byte);
                let low = self.bits_of(argument, &at, &shift, 15, run);
                let at = self.byte_index(base, 16, &l);
                let fifth = self.bits_of(argument, &at, &group, 1, run);
                let four = self.op(run.constant("4", "i8"));
                let fifth = self.op(format!("arith.shli {fifth}, {four} : {i8s}"));
                self.op(format!("arith.ori {low}, {fifth} : {i8s}"))
            }
            BlockFormat::Iq4Xs => {
                // Group `g`'s sixteen bytes from `8 + 16 · g`, low then high.
                let (thirty_two, sixteen) = (self.index_constant(32), self.index_constant(16));
                let group = self.op(format!("arith.divui {within}, {thirty_two} : index"));
                let l = self.op(format!("arith.remui {within}, {thirty_two} : index"));
                let start = self.mul(&group, &sixteen);
                let start = self.byte_index(base, 8, &start);
                let nibbles = self.nibbles_from(argument, &start, &l, run);
                self.looked_up(&nibbles, &layouts::IQ4_LEVELS, run)
            }
            BlockFormat::Q8_0 | BlockFormat::Q4K | BlockFormat::Q6K => {
                unreachable!("{format} reads its levels with its scales")
            }
        }
    }

    /// The step (an f32 register) and offset of group `group` (an index)
    /// of the block at `base` (`quant::layouts::group_scale`).
    fn group_scale(&mut self, format: BlockFormat, argument: &str, base: &str, group: &str) -> (String, Added) {
        let int = |e: &mut Self, value: i64| e.op(format!("arith.constant {value} : i32"));
        match format {
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Iq4Nl => {
                (self.half_at(argument, base, 0), Added::None)
            }
            BlockFormat::Q4_1 | BlockFormat::Q5_1 => {
                (self.half_at(argument, base, 0), Added::Plus(self.half_at(argument, base, 2)))
            }
            BlockFormat::Mxfp4 => {
                // `2^(e − 128)`: `0x00200000 << e` below 2, else `(e − 1) << 23`.
                let zero = self.index_constant(0);
                let e = self.byte_at(argument, base, &zero);
                let (one, two, low, twenty_three) = (int(self, 1), int(self, 2), int(self, 0x0020_0000), int(self, 23));
                let subnormal = self.op(format!("arith.shli {low}, {e} : i32"));
                let less = self.op(format!("arith.subi {e}, {one} : i32"));
                let normal = self.op(format!("arith.shli {less}, {twenty_three} : i32"));
                let small = self.op(format!("arith.cmpi ult, {e}, {two} : i32"));
                let bits = self.op(format!("arith.select {small}, {subnormal}, {normal} : i32"));
                (self.op(format!("arith.bitcast {bits} : i32 to f32")), Added::None)
            }
            BlockFormat::Q2K => {
                let packed = self.byte_at(argument, base, group);
                let (fifteen, four) = (int(self, 15), int(self, 4));
                let scale = self.op(format!("arith.andi {packed}, {fifteen} : i32"));
                let min = self.op(format!("arith.shrui {packed}, {four} : i32"));
                let scale = self.op(format!("arith.uitofp {scale} : i32 to f32"));
                let min = self.op(format!("arith.uitofp {min} : i32 to f32"));
                let (d, dmin) = (self.half_at(argument, base, 80), self.half_at(argument, base, 82));
                let step = self.op(format!("arith.mulf {d}, {scale} : f32"));
                (step, Added::Minus(self.op(format!("arith.mulf {dmin}, {min} : f32"))))
            }
            BlockFormat::Q3K => {
                // Low four bits: byte `96 + g % 8` shifted `4 · (g / 8)`;
                // top two: byte `104 + g % 4` shifted `2 · (g / 4)`.
                let (eight, four) = (self.index_constant(8), self.index_constant(4));
                let low = (
                    self.op(format!("arith.remui {group}, {eight} : index")),
                    96,
                    self.op(format!("arith.divui {group}, {eight} : index")),
                );
                let high = (
                    self.op(format!("arith.remui {group}, {four} : index")),
                    104,
                    self.op(format!("arith.divui {group}, {four} : index")),
                );
                (self.six_bit_step(argument, base, low, high, 108), Added::None)
            }
            BlockFormat::Q5K => {
                let (step, offset) = self.k_scale_and_min(argument, base, group);
                (step, Added::Minus(offset))
            }
            BlockFormat::Iq4Xs => {
                // Low four bits: byte `4 + g / 2` shifted `4 · (g % 2)`; top
                // two: byte `2 + g / 4` shifted `2 · (g % 4)`.
                let (two, four) = (self.index_constant(2), self.index_constant(4));
                let low = (
                    self.op(format!("arith.divui {group}, {two} : index")),
                    4,
                    self.op(format!("arith.remui {group}, {two} : index")),
                );
                let high = (
                    self.op(format!("arith.divui {group}, {four} : index")),
                    2,
                    self.op(format!("arith.remui {group}, {four} : index")),
                );
                (self.six_bit_step(argument, base, low, high, 0), Added::None)
            }
            BlockFormat::Q8_0 | BlockFormat::Q4K | BlockFormat::Q6K => {
                unreachable!("{format} reads its levels with its scales")
            }
        }
    }

    /// `d · (scale − 32)` (an f32), `d` the f16 at byte `half`, the 6-bit
    /// scale's low four bits from byte `low.1 + low.0` shifted by `4 ·
    /// low.2` and its top two from byte `high.1 + high.0` shifted by `2 ·
    /// high.2` (the indices `.0` and `.2` of the group's).
    fn six_bit_step(
        &mut self,
        argument: &str,
        base: &str,
        low: (String, i64, String),
        high: (String, i64, String),
        half: i64,
    ) -> String {
        let part = |e: &mut Self, (byte, start, count): (String, i64, String), unit: i64, mask: i64| {
            let start = e.index_constant(start);
            let byte = e.add(&byte, &start);
            let value = e.byte_at(argument, base, &byte);
            e.shifted_bits(&value, &count, unit, mask)
        };
        let low = part(self, low, 4, 15);
        let high = part(self, high, 2, 3);
        let (four, thirty_two) = (self.op("arith.constant 4 : i32".into()), self.op("arith.constant 32 : i32".into()));
        let high = self.op(format!("arith.shli {high}, {four} : i32"));
        let scale = self.op(format!("arith.ori {low}, {high} : i32"));
        let scale = self.op(format!("arith.subi {scale}, {thirty_two} : i32"));
        let scale = self.op(format!("arith.sitofp {scale} : i32 to f32"));
        let d = self.half_at(argument, base, half);
        self.op(format!("arith.mulf {d}, {scale} : f32"))
    }

    /// `(value >> (unit · count)) & mask` of an i32 `value`, `count` an index.
    fn shifted_bits(&mut self, value: &str, count: &str, unit: i64, mask: i64) -> String {
        let unit = self.index_constant(unit);
        let shift = self.mul(count, &unit);
        let shift = self.op(format!("arith.index_cast {shift} : index to i32"));
        let shifted = self.op(format!("arith.shrui {value}, {shift} : i32"));
        let mask = self.op(format!("arith.constant {mask} : i32"));
        self.op(format!("arith.andi {shifted}, {mask} : i32"))
    }

    /// The nibbles of values `within..` of a run of 32 whose sixteen bytes
    /// start at byte `start` of the block: values 0–15 low, 16–31 high.
    fn nibbles_of_32(&mut self, argument: &str, base: &str, start: i64, within: &str, run: &Run) -> String {
        let thirty_two = self.index_constant(32);
        let l = self.op(format!("arith.remui {within}, {thirty_two} : index"));
        let zero = self.index_constant(0);
        let start = self.byte_index(base, start, &zero);
        self.nibbles_from(argument, &start, &l, run)
    }

    /// [`Emitter::nibbles_of_32`] from the absolute byte `start`, for
    /// values `l..` (below 32) of the run.
    fn nibbles_from(&mut self, argument: &str, start: &str, l: &str, run: &Run) -> String {
        let (sixteen, four) = (self.index_constant(16), self.index_constant(4));
        let byte = self.op(format!("arith.remui {l}, {sixteen} : index"));
        let half = self.op(format!("arith.divui {l}, {sixteen} : index"));
        let shift = self.mul(&half, &four);
        let at = self.add(start, &byte);
        self.bits_of(argument, &at, &shift, 15, run)
    }

    /// Q5_0's and Q5_1's fifth bits of the run: bit `i` of the four bytes
    /// at `start` for value `i` (a run of eight lies in one byte).
    fn fifth_bits(&mut self, argument: &str, base: &str, start: i64, within: &str, run: &Run) -> String {
        let (thirty_two, eight) = (self.index_constant(32), self.index_constant(8));
        let l = self.op(format!("arith.remui {within}, {thirty_two} : index"));
        let byte = self.op(format!("arith.divui {l}, {eight} : index"));
        let first = self.op(format!("arith.remui {l}, {eight} : index"));
        let at = self.byte_index(base, start, &byte);
        let zero = self.index_constant(0);
        let byte = self.load_byte(argument, &at, &zero);
        let byte = self.splat_as(&byte, "i8", run);
        let first = self.op(format!("arith.index_cast {first} : index to i8"));
        let first = self.splat_as(&first, "i8", run);
        let i8s = run.of("i8");
        let shift = match run.width {
            1 => first,
            width => {
                let lanes = (0..width).map(|lane| lane.to_string()).collect::<Vec<_>>().join(", ");
                let lanes = self.op(format!("arith.constant dense<[{lanes}]> : {i8s}"));
                self.op(format!("arith.addi {first}, {lanes} : {i8s}"))
            }
        };
        let shifted = self.op(format!("arith.shrui {byte}, {shift} : {i8s}"));
        let one = self.op(run.constant("1", "i8"));
        self.op(format!("arith.andi {shifted}, {one} : {i8s}"))
    }

    /// Q2_K's and Q3_K's two bits of the run, from the 64 bytes at
    /// `start`: value `128c + 32s + l` at byte `32c + l`, shifted `2s`.
    fn two_bits(&mut self, argument: &str, base: &str, start: i64, within: &str, run: &Run) -> String {
        let (half_values, thirty_two, two) =
            (self.index_constant(128), self.index_constant(32), self.index_constant(2));
        let half = self.op(format!("arith.divui {within}, {half_values} : index"));
        let rest = self.op(format!("arith.remui {within}, {half_values} : index"));
        let part = self.op(format!("arith.divui {rest}, {thirty_two} : index"));
        let l = self.op(format!("arith.remui {rest}, {thirty_two} : index"));
        let half_start = self.mul(&half, &thirty_two);
        let byte = self.add(&half_start, &l);
        let shift = self.mul(&part, &two);
        let at = self.byte_index(base, start, &byte);
        self.bits_of(argument, &at, &shift, 3, run)
    }

    /// `table[nibble]` for each of the run's nibbles (`i8`s below 16).
    fn looked_up(&mut self, nibbles: &str, table: &[i8; 16], run: &Run) -> String {
        let i8s = run.of("i8");
        let mut found = self.op(run.constant(&table[0].to_string(), "i8"));
        for (nibble, level) in table.iter().enumerate().skip(1) {
            let nibble = self.op(run.constant(&nibble.to_string(), "i8"));
            let level = self.op(run.constant(&level.to_string(), "i8"));
            let here = self.op(format!("arith.cmpi eq, {nibbles}, {nibble} : {i8s}"));
            found = self.op(format!("arith.select {here}, {level}, {found} : {}, {i8s}", run.of("i1")));
        }
        found
    }

    /// Q4_K: 32-value group `within / 32` has a 6-bit scale and min
    /// (`quant::q4_k_scales_mins`' packing); its nibbles are the low (even
    /// group) or high (odd) halves of 32 bytes shared by a pair of groups.
    fn q4_k(&mut self, argument: &str, base: &str, within: &str, run: &Run) -> String {
        let thirty_two = self.index_constant(32);
        let group = self.op(format!("arith.divui {within}, {thirty_two} : index"));
        let (step, offset) = self.k_scale_and_min(argument, base, &group);
        let four = self.index_constant(4);
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

    /// Q4_K's and Q5_K's `d · scale` and `dmin · min` of group `group`
    /// (an index): the 6-bit scale and min as `quant::q4_k_scales_mins`
    /// packs them.
    fn k_scale_and_min(&mut self, argument: &str, base: &str, group: &str) -> (String, String) {
        let (d, dmin) = (self.half_at(argument, base, 0), self.half_at(argument, base, 2));
        let (four, eight) = (self.index_constant(4), self.index_constant(8));
        // Bytes `group`, `group + 4` and `group % 4` of the packed twelve
        // (which start at byte 4).
        let group_byte = self.add(group, &four);
        let a = self.byte_at(argument, base, &group_byte);
        let min_byte = self.add(group, &eight);
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
        (step, offset)
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
