//! The names of a module's variables (`__device__` and `__constant__`: PTX's
//! `.global` and `.const` declarations), read from its PTX: the driver has no call
//! that lists them, and a migrated session must carry their contents, which kernels
//! and `cudaMemcpyToSymbol` wrote.

use crate::fatbin::{self, Image};

/// The variables of module image `image` (PTX, or a fatbin holding PTX), `None`
/// where it has no PTX (a cubin alone) or cannot be read.
pub fn of_image(image: &[u8]) -> Option<Vec<String>> {
    let image = image.strip_suffix(&[0]).unwrap_or(image);
    let head: [u8; 4] = image.get(..4)?.try_into().ok()?;
    match fatbin::classify(head) {
        Image::Ptx => Some(of_ptx(std::str::from_utf8(image).ok()?)),
        Image::Fatbin => {
            let entries = fatbin::entries(image).ok()?;
            let ptx = entries.iter().find(|e| e.kind == fatbin::Kind::Ptx)?;
            let text = ptx.contents().ok()?;
            Some(of_ptx(std::str::from_utf8(&text).ok()?))
        }
        Image::Elf | Image::Wrapper => None,
    }
}

/// The names PTX text declares in the global and constant state spaces (defined
/// here: `.extern` declarations are another module's).
pub fn of_ptx(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        let at_top = depth == 0;
        depth += code.matches('{').count();
        depth = depth.saturating_sub(code.matches('}').count());
        if !at_top {
            continue;
        }
        let decl = code.split('=').next().unwrap_or("");
        let decl = decl.split(';').next().unwrap_or("").trim();
        let mut tokens = decl.split_whitespace();
        let Some(first) = tokens.clone().next() else {
            continue;
        };
        if ![".visible", ".global", ".const", ".weak"].contains(&first) {
            continue;
        }
        if !tokens.any(|t| t == ".global" || t == ".const") || decl.contains(".extern") {
            continue;
        }
        let Some(last) = decl.split_whitespace().last() else {
            continue;
        };
        let name = last.split('[').next().unwrap_or(last);
        if !name.is_empty() && !name.starts_with('.') {
            names.push(name.to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_variables_nvcc_declares() {
        let ptx = "\
.version 8.0
.target sm_75
.address_size 64
.visible .global .align 4 .b8 table[400];
.global .align 4 .u32 counter = 5;
.const .align 4 .b8 coeffs[32] = {0, 0, 128, 63};
.extern .global .align 4 .u32 elsewhere;
.visible .entry k(
\t.param .u64 k_param_0
)
{
\tld.global.u32 %r1, [counter];
\tst.global.u32 [table], %r1;
}
";
        assert_eq!(of_ptx(ptx), ["table", "counter", "coeffs"]);
        let mut image = ptx.as_bytes().to_vec();
        image.push(0);
        assert_eq!(of_image(&image).unwrap(), ["table", "counter", "coeffs"]);
        assert_eq!(of_image(b"\x7fELF\x02\x01"), None);
    }
}
