//! Writes `driver_api.rs`: the table of the driver entry points the workspace
//! binds, each at one fixed ABI version (`PFN_<name>_v<version>`), checked to
//! be the same in CUDA 12 and 13.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::Path;

use crate::emit::section;
use crate::lists::{DriverList, driver_base, pfn_name};
use crate::parse::Signature;

const DRIVER_STRUCT: &str = r#"
use crate::driver::*;

/// The CUDA driver entry points this crate binds, each at one fixed ABI
/// version, resolved at run time (see [`crate::driver()`]). Every field is a
/// plain C function pointer: calling one is `unsafe` and follows the CUDA
/// driver API documentation of the function of that name.
#[allow(non_snake_case)]
#[derive(Clone, Copy)]
pub struct DriverApi {
"#;

const SYMBOLS_HEAD: &str = r#"/// Each entry of the table: `(field and libcuda.so.1 symbol, base name for
/// cudaGetDriverEntryPointByVersion, ABI version)`.
pub const DRIVER_SYMBOLS: &[(&str, &str, u32)] = &[
"#;

const RESOLVE_HEAD: &str = r#"impl DriverApi {
    /// Builds the table from a lookup: `lookup(symbol, base, version)` returns the
    /// address of driver function `symbol` (e.g. `"cuCtxCreate_v2\0"`), whose
    /// base name is `base` (`"cuCtxCreate\0"`) at ABI version `version`, or null.
    /// Both names end with a NUL. Returns the first symbol that was not found.
    ///
    /// # Safety
    /// Every non-null address `lookup` returns must be that driver function with
    /// the ABI of `PFN_<base>_v<version>` of `cudaTypedefs.h`, valid for as long
    /// as the returned table is used.
    pub unsafe fn resolve(
        mut lookup: impl FnMut(&'static str, &'static str, u32) -> *mut ::core::ffi::c_void,
    ) -> Result<Self, &'static str> {
        let mut sym = |symbol: &'static str, base: &'static str, version: u32| {
            let p = lookup(symbol, base, version);
            if p.is_null() { Err(symbol.trim_end_matches('\0')) } else { Ok(p) }
        };
        Ok(Self {
"#;

const RESOLVE_TAIL: &str = "        })\n    }\n}\n";

/// One function of the table, checked to have the same ABI in CUDA 12 and 13.
struct Row<'a> {
    symbol: &'a str,
    base: &'a str,
    version: u32,
    doc: &'a str,
    pfn: String,
    ty: String,
}

/// Checks that the CUDA 12 `cuda.h` maps each bound base name to the symbol
/// the table resolves from `libcuda.so.1` (`#define cuCtxCreate cuCtxCreate_v2`).
pub fn check_driver_symbols(list: &DriverList, include12: &Path) -> Result<(), String> {
    let path = include12.join("cuda.h");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    for (symbol, _, _) in list.functions {
        let base = driver_base(symbol);
        let mapped = text.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#define") && w.next() == Some(base)).then(|| w.next().unwrap_or("").to_string())
        });
        let ok = match &mapped {
            Some(m) => m == symbol,
            None => base == *symbol,
        };
        if !ok {
            return Err(format!(
                "{}: {base} maps to {mapped:?}, but the table binds {symbol}: fix DRIVER_FUNCTIONS",
                path.display()
            ));
        }
    }
    Ok(())
}

/// The text of `driver_api.rs` after its header, from the `PFN_*` types of
/// CUDA 13 and 12; an error when one is missing or differs between them.
pub fn driver_api_rs(
    list: &DriverList,
    v13: &BTreeMap<String, Signature>,
    v12: &BTreeMap<String, Signature>,
) -> Result<String, String> {
    let mut rows = Vec::new();
    for &(symbol, version, doc) in list.functions {
        let pfn = pfn_name(symbol, version);
        let t13 = v13.get(&pfn).ok_or_else(|| format!("{pfn} not found in the CUDA 13 cudaTypedefs.h"))?;
        let t12 = v12.get(&pfn).ok_or_else(|| format!("{pfn} not found in the CUDA 12 cudaTypedefs.h"))?;
        if t13 != t12 {
            return Err(format!("{pfn}: differs between CUDA 12 ({t12}) and 13 ({t13})"));
        }
        rows.push(Row { symbol, base: driver_base(symbol), version, doc, pfn, ty: t13.to_string() });
    }
    let mut s = String::new();
    write_driver_api(&mut s, &rows).map_err(|e| e.to_string())?;
    Ok(s)
}

fn write_driver_api(s: &mut String, rows: &[Row]) -> fmt::Result {
    section(s, DRIVER_STRUCT, rows, "}\n\n", |s, r| {
        writeln!(s, "    /// {} ABI: `{}`.\n    pub {}: {},", r.doc, r.pfn, r.symbol, r.ty)
    })?;
    section(s, SYMBOLS_HEAD, rows, "];\n\n", |s, r| {
        writeln!(s, "    (\"{}\", \"{}\", {}),", r.symbol, r.base, r.version)
    })?;
    section(s, RESOLVE_HEAD, rows, RESOLVE_TAIL, write_resolved)
}

/// One field of `DriverApi::resolve`: the looked-up address as the field's type.
fn write_resolved(s: &mut String, r: &Row) -> fmt::Result {
    writeln!(s, "            // SAFETY: the caller guarantees the address is this driver function with the")?;
    writeln!(s, "            // ABI of {}, whose C signature the headers give as this type.", r.pfn)?;
    writeln!(
        s,
        "            {}: unsafe {{ ::core::mem::transmute::<*mut ::core::ffi::c_void, {}>(sym(\"{}\\0\", \"{}\\0\", {})?) }},",
        r.symbol, r.ty, r.symbol, r.base, r.version
    )
}
