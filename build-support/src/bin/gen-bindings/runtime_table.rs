//! Writes `api.rs`: the table of runtime function pointers that `cuda-sys`
//! fills by `dlopen`, with the symbol to resolve for each major version, and
//! a `PFN_<name>` type for each optional function.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use crate::emit::section;
use crate::lists::{RuntimeFn, RuntimeList};
use crate::parse::Decl;

const API_STRUCT: &str = r#"
use crate::*;

/// The CUDA runtime entry points this crate binds, resolved from one loaded
/// library. Every field is a plain C function pointer: calling one is `unsafe`
/// and follows the CUDA runtime API documentation of the function of that name.
#[allow(non_snake_case)]
#[derive(Clone, Copy)]
pub struct Api {
"#;

const SYMBOLS_HEAD: &str = r#"/// The symbol each table entry is resolved from: `(field, CUDA 13 symbol, CUDA 12 symbol)`.
pub const SYMBOLS: &[(&str, &str, &str)] = &[
"#;

const RESOLVE_HEAD: &str = r#"impl Api {
    /// Builds the table from a symbol lookup (`dlsym` on the loaded library).
    /// `major` selects the symbol names (CUDA 12 renamed some entry points).
    /// Returns the first symbol that could not be found.
    ///
    /// # Safety
    /// Every non-null address `lookup` returns for a symbol must be that CUDA
    /// runtime function of the given major version, valid for as long as the
    /// returned table is used.
    pub unsafe fn resolve(
        major: i32,
        mut lookup: impl FnMut(&'static str) -> *mut ::core::ffi::c_void,
    ) -> Result<Self, &'static str> {
        let mut sym = |s13: &'static str, s12: &'static str, fallback12: Option<&'static str>| {
            let name = if major >= 13 { s13 } else { s12 };
            let mut p = lookup(name);
            if p.is_null() && major < 13 && let Some(f) = fallback12 {
                p = lookup(f);
            }
            if p.is_null() { Err(name) } else { Ok(p) }
        };
        Ok(Self {
"#;

const LINKED_HEAD: &str = r#"
    /// The table of the runtime this crate was linked against (feature `link`),
    /// bound to the CUDA 13 symbols.
    #[cfg(feature = "link")]
    pub fn linked() -> Self {
        Self {
"#;

const LINKED_TAIL: &str = "        }\n    }\n}\n";

/// One function of the table, checked to have the same ABI in CUDA 12 and 13.
struct Row<'a> {
    name: &'a str,
    doc: &'a str,
    /// The field's type: the CUDA 13 signature, versioned structs erased.
    ty: String,
    s13: &'a str,
    s12: &'a str,
    /// Whether `ty` erased a versioned struct (the linked function differs in type).
    erased: bool,
}

type Decls = BTreeMap<String, Decl>;

/// The text of `api.rs` after its header, from the CUDA 13 and 12 declarations;
/// an error when a bound function is missing or its signature differs between
/// the versions.
pub fn api_rs(list: &RuntimeList, v13: &Decls, v12: &Decls) -> Result<String, String> {
    let rows = list.functions.iter().map(|f| row(f, v13, v12)).collect::<Result<Vec<_>, _>>()?;
    let optional = list.optional.iter().map(|f| row(f, v13, v12)).collect::<Result<Vec<_>, _>>()?;
    let mut s = String::new();
    write_api(&mut s, &rows, &optional, list.same_abi_fallback_12).map_err(|e| e.to_string())?;
    Ok(s)
}

/// The declarations of `name` in both versions, checked to have the same ABI.
fn row<'a>(&(name, doc): &'a RuntimeFn, v13: &'a Decls, v12: &'a Decls) -> Result<Row<'a>, String> {
    let d13 = v13.get(name).ok_or_else(|| format!("{name} not found in the CUDA 13 headers"))?;
    let d12 = v12.get(name).ok_or_else(|| format!("{name} not found in the CUDA 12 headers"))?;
    if !d13.sig.same_abi(&d12.sig) {
        return Err(format!("{name}: signature differs between CUDA 12 ({}) and 13 ({})", d12.sig, d13.sig));
    }
    Ok(Row {
        name,
        doc,
        ty: d13.table_sig.to_string(),
        s13: &d13.symbol,
        s12: &d12.symbol,
        erased: d13.table_sig != d13.sig,
    })
}

fn write_api(s: &mut String, rows: &[Row], optional: &[Row], fallback12: &[&str]) -> fmt::Result {
    section(s, API_STRUCT, rows, "}\n\n", |s, r| writeln!(s, "    /// {}\n    pub {}: {},", r.doc, r.name, r.ty))?;
    section(s, SYMBOLS_HEAD, rows, "];\n\n", |s, r| {
        writeln!(s, "    (\"{}\", \"{}\", \"{}\"),", r.name, r.s13, r.s12)
    })?;
    for r in optional {
        writeln!(s, "/// {}\n/// Not in [`Api`]: only some supported runtimes export `{}`.", r.doc, r.s13)?;
        writeln!(s, "pub type PFN_{} = {};\n", r.name, r.ty)?;
    }
    section(s, RESOLVE_HEAD, rows, "        })\n    }\n", |s, r| write_resolved(s, r, fallback12))?;
    section(s, LINKED_HEAD, rows, LINKED_TAIL, write_linked)
}

/// One field of `Api::resolve`: the looked-up address as the field's type.
fn write_resolved(s: &mut String, r: &Row, fallback12: &[&str]) -> fmt::Result {
    let fallback = if fallback12.contains(&r.name) && r.s12.ends_with("_v2") {
        format!("Some(\"{}\\0\")", r.name)
    } else {
        "None".to_string()
    };
    writeln!(s, "            // SAFETY: the caller guarantees the address is this function of the loaded runtime,")?;
    writeln!(s, "            // whose C signature the headers give as this type.")?;
    writeln!(
        s,
        "            {}: unsafe {{ ::core::mem::transmute::<*mut ::core::ffi::c_void, {}>(sym(\"{}\\0\", \"{}\\0\", {fallback})?) }},",
        r.name, r.ty, r.s13, r.s12
    )
}

/// One field of `Api::linked`: the linked CUDA 13 function.
fn write_linked(s: &mut String, r: &Row) -> fmt::Result {
    let name = r.name;
    if r.erased {
        writeln!(
            s,
            "            // SAFETY: only the pointee type of a versioned struct is erased; the ABI is the same."
        )?;
        writeln!(
            s,
            "            {name}: unsafe {{ ::core::mem::transmute::<*const (), {}>(crate::cuda13::{name} as *const ()) }},",
            r.ty
        )
    } else {
        writeln!(s, "            {name}: crate::cuda13::{name},")
    }
}
