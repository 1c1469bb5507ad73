//! The standard library's functions that run as kernels: their Linnet
//! bodies stay the definition (the tests hold the kernels to them bit for
//! bit on the interpreter), and with `Lowering::library_kernels` a call
//! lowers to the kernel instead. The library's module paths are the
//! frontend's to know; the IR names only the kernels.

use linnet_ir::Intrinsic;

/// The kernel for the standard library function `name` of `module`, if it
/// has one.
pub(super) fn kernel_of(module: &str, name: &str) -> Option<Intrinsic> {
    Some(match (module, name) {
        ("std.nn.attention", "grouped_attention") => Intrinsic::GroupedAttention,
        ("std.nn.attention", "grouped_attention_rows") => Intrinsic::GroupedAttentionRows,
        ("std.nn.attention", "grouped_attention_sinks") => Intrinsic::GroupedAttentionSinks,
        ("std.nn.cache", "write_at") => Intrinsic::WriteAt,
        ("std.nn.cache", "write_span") => Intrinsic::WriteSpan,
        ("std.nn.cache", "write_rows") => Intrinsic::WriteRows,
        ("std.nn.cache", "write_slots") => Intrinsic::WriteSlots,
        _ => return None,
    })
}
