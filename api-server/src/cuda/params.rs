//! Kernel parameter layouts read from a module's PTX, for drivers older than CUDA
//! 12.4, which lack `cuFuncGetParamInfo`: the guest needs each parameter's offset
//! and size to pack `kernelParams`. Parameters are laid out in order, each at the
//! next multiple of its alignment (`.align N`, else its type's size), as the driver
//! lays out the parameter buffer.

/// The layout of entry point `name`'s parameters: (offset, size) each, or `None` if
/// the PTX has no such entry or a parameter it cannot read.
pub fn layout(ptx: &str, name: &str) -> Option<Vec<(u32, u32)>> {
    let params = entry_params(ptx, name)?;
    let mut out = Vec::new();
    let mut offset = 0u32;
    for p in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (align, size) = param(p)?;
        offset = offset.checked_next_multiple_of(align)?;
        out.push((offset, size));
        offset = offset.checked_add(size)?;
    }
    Some(out)
}

/// The text between the parentheses of `.entry name (...)`.
fn entry_params<'a>(ptx: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = ptx;
    while let Some(i) = rest.find(".entry") {
        let after = rest[i + ".entry".len()..].trim_start();
        let ident_len = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
            .unwrap_or(after.len());
        let tail = after[ident_len..].trim_start();
        if &after[..ident_len] == name && tail.starts_with('(') {
            let close = tail.find(')')?;
            return Some(&tail[1..close]);
        }
        rest = &after[ident_len..];
    }
    None
}

/// Alignment and size of one parameter declaration, e.g. `.param .u64 .ptr .align 1
/// a` or `.param .align 8 .b8 s[24]`.
fn param(decl: &str) -> Option<(u32, u32)> {
    let mut ty_size: Option<u32> = None;
    let mut align = None;
    let mut count = 1u32;
    let mut pointer = false;
    let mut words = decl.split_whitespace();
    while let Some(w) = words.next() {
        match w {
            ".param" | ".global" | ".const" | ".shared" | ".local" => {}
            // After `.ptr`, `.align` is the pointee's alignment, not the parameter's.
            ".ptr" => pointer = true,
            ".align" => {
                let a = words.next()?.parse::<u32>().ok()?;
                if !pointer {
                    align = Some(a);
                }
            }
            t if t.starts_with('.') => {
                ty_size = Some(match &t[1..] {
                    "b8" | "u8" | "s8" | "pred" => 1,
                    "b16" | "u16" | "s16" | "f16" => 2,
                    "b32" | "u32" | "s32" | "f32" => 4,
                    "b64" | "u64" | "s64" | "f64" => 8,
                    _ => return None,
                });
            }
            n => {
                if let Some((_, c)) = n.split_once('[') {
                    count = c.trim_end_matches(']').parse().ok()?;
                }
            }
        }
    }
    let size = ty_size?.checked_mul(count)?;
    let align = align.unwrap_or(ty_size?).max(1);
    align.is_power_of_two().then_some((align, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "
.visible .entry other(.param .u32 x, .param .u64 .ptr .global .align 1 y) { ret; }
.visible .entry k(
	.param .u64 .ptr .align 1 k_param_0,
	.param .f32 k_param_1,
	.param .align 8 .b8 k_param_2[24],
	.param .u8 k_param_3,
	.param .u64 k_param_4
)
{ ret; }";

    #[test]
    fn parameters_are_aligned_as_the_driver_lays_them_out() {
        assert_eq!(
            layout(PTX, "k"),
            Some(vec![(0, 8), (8, 4), (16, 24), (40, 1), (48, 8)])
        );
        assert_eq!(layout(PTX, "other"), Some(vec![(0, 4), (8, 8)]));
    }

    #[test]
    fn unknown_entries_and_types_give_no_layout() {
        assert_eq!(layout(PTX, "missing"), None);
        assert_eq!(layout(PTX, "k_param_0"), None);
        assert_eq!(layout(".entry z(.param .v4 a)", "z"), None);
    }
}
