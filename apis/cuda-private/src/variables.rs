//! The names of a module's variables (`__device__` and `__constant__`: PTX's
//! `.global` and `.const` declarations, a cubin's defined data symbols), read from
//! its PTX or, for a cubin alone, from its symbol table: the driver has no call
//! that lists them, and a migrated session must carry their contents, which kernels
//! and `cudaMemcpyToSymbol` wrote.

use object::read::elf::ElfFile64;
use object::{Object, ObjectSymbol, SymbolKind};

use crate::fatbin::{self, Image};

/// The variables of module image `image` (PTX, a cubin, or a fatbin holding either),
/// `None` where it cannot be read.
pub fn of_image(image: &[u8]) -> Option<Vec<String>> {
    let head: [u8; 4] = image.get(..4)?.try_into().ok()?;
    match fatbin::classify(head) {
        Image::Ptx => {
            let image = image.strip_suffix(&[0]).unwrap_or(image);
            Some(of_ptx(std::str::from_utf8(image).ok()?))
        }
        Image::Fatbin => {
            let entries = fatbin::entries(image).ok()?;
            if let Some(ptx) = entries.iter().find(|e| e.kind == fatbin::Kind::Ptx) {
                let text = ptx.contents().ok()?;
                let text = text.strip_suffix(&[0]).unwrap_or(&text);
                return Some(of_ptx(std::str::from_utf8(text).ok()?));
            }
            // Cubins alone: every one of them defines the module's variables.
            let cubin = entries.iter().find(|e| e.kind == fatbin::Kind::Elf)?;
            of_cubin(&cubin.contents().ok()?)
        }
        Image::Elf => of_cubin(image),
        Image::Wrapper => None,
    }
}

/// The data objects a cubin defines (its `__device__` and `__constant__` variables,
/// which ptxas makes local symbols; the driver finds them by name all the same),
/// from its ELF symbol table; `None` if it does not parse as a 64-bit ELF file.
pub fn of_cubin(image: &[u8]) -> Option<Vec<String>> {
    let elf = ElfFile64::<object::Endianness>::parse(image).ok()?;
    let mut names: Vec<String> = elf
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Data && s.is_definition())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    Some(names)
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

    /// nvcc 13's output for `data/variables.cu`: ptxas makes the variables local
    /// data symbols (the static one too), beside the kernel's function symbol.
    #[test]
    fn reads_the_variables_of_a_cubin_alone_and_of_a_fatbin_of_cubins() {
        let cubin = include_bytes!("../data/variables-sm75.cubin");
        let fatbin = include_bytes!("../data/variables-sm75.fatbin");
        for image in [&cubin[..], &fatbin[..]] {
            assert_eq!(of_image(image).unwrap(), ["coeffs", "counter", "hidden"]);
        }
        // Not an ELF file.
        assert_eq!(of_cubin(&cubin[..0]), None);
    }
}
