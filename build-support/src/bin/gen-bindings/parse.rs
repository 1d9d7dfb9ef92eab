//! Reads bindgen's output with `syn`: the function declarations of an `extern`
//! block and the function pointer typedefs (`PFN_*`), each rendered back as the
//! one-line Rust type the generated tables carry.

use std::collections::BTreeMap;
use std::fmt;

use syn::{FnArg, ForeignItem, GenericArgument, Item, Pat, PathArguments, ReturnType, Type, TypeBareFn};

/// A C function's signature as an `unsafe extern "C" fn` type: its parameters
/// `(name, type)` and its return type (empty for none), each type on one line.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    pub params: Vec<(String, String)>,
    pub ret: String,
}

impl Signature {
    /// Whether both take the same parameter types and return the same type
    /// (parameter names may differ).
    pub fn same_abi(&self, other: &Signature) -> bool {
        self.params.iter().map(|p| &p.1).eq(other.params.iter().map(|p| &p.1)) && self.ret == other.ret
    }
}

impl fmt::Display for Signature {
    /// `unsafe extern "C" fn(name: T, ..) -> R`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unsafe extern \"C\" fn(")?;
        for (i, (name, ty)) in self.params.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{name}: {ty}")?;
        }
        f.write_str(")")?;
        if !self.ret.is_empty() {
            write!(f, " -> {}", self.ret)?;
        }
        Ok(())
    }
}

/// One `pub fn` of bindgen's `extern "C"` block.
#[derive(Debug, Clone, PartialEq)]
pub struct Decl {
    /// The C symbol (`cudaGetDeviceProperties_v2`).
    pub symbol: String,
    /// The signature as the headers give it.
    pub sig: Signature,
    /// The signature with pointers to the erased structs as `c_void` pointers.
    pub table_sig: Signature,
}

/// Reads the `pub fn name(params) -> ret;` items of bindgen's extern blocks,
/// keyed by the name without a `_v2` suffix. Pointers to the structs named in
/// `erase` become `c_void` pointers in [`Decl::table_sig`].
pub fn parse_decls(src: &str, erase: &[&str]) -> Result<BTreeMap<String, Decl>, String> {
    let file = syn::parse_file(src).map_err(|e| format!("bindgen's function declarations: {e}"))?;
    let mut out = BTreeMap::new();
    let fns = file.items.iter().filter_map(|item| match item {
        Item::ForeignMod(block) => Some(block.items.iter()),
        _ => None,
    });
    for item in fns.flatten() {
        let ForeignItem::Fn(f) = item else { continue };
        let symbol = f.sig.ident.to_string();
        let context = |e: String| format!("{symbol}: {e}");
        if f.sig.variadic.is_some() {
            return Err(context("variadic functions are not bound".into()));
        }
        let mut params = Vec::new();
        for input in &f.sig.inputs {
            let FnArg::Typed(p) = input else { return Err(context("a receiver in an extern block".into())) };
            let Pat::Ident(name) = &*p.pat else { return Err(context("a parameter without a name".into())) };
            params.push((name.ident.to_string(), &*p.ty));
        }
        let sig = signature(&params, &f.sig.output, &[]).map_err(context)?;
        let table_sig = signature(&params, &f.sig.output, erase).map_err(context)?;
        let key = symbol.strip_suffix("_v2").unwrap_or(&symbol).to_string();
        out.insert(key, Decl { symbol, sig, table_sig });
    }
    Ok(out)
}

/// The function types of bindgen's `pub type PFN_x = Option<unsafe extern "C" fn(..) -> R>;`
/// items, by typedef name.
pub fn parse_pfns(src: &str) -> Result<BTreeMap<String, Signature>, String> {
    let file = syn::parse_file(src).map_err(|e| format!("bindgen's driver types: {e}"))?;
    let mut out = BTreeMap::new();
    for item in &file.items {
        let Item::Type(t) = item else { continue };
        let name = t.ident.to_string();
        if !name.starts_with("PFN_") {
            continue;
        }
        let f = optional_fn(&t.ty).ok_or_else(|| format!("{name}: not an optional function pointer"))?;
        if !is_unsafe_extern_c(f) {
            return Err(format!("{name}: not an `unsafe extern \"C\"` function"));
        }
        if f.variadic.is_some() {
            return Err(format!("{name}: variadic functions are not bound"));
        }
        let mut params = Vec::new();
        for arg in &f.inputs {
            let (param, _) = arg.name.as_ref().ok_or_else(|| format!("{name}: a parameter without a name"))?;
            params.push((param.to_string(), &arg.ty));
        }
        out.insert(name.clone(), signature(&params, &f.output, &[]).map_err(|e| format!("{name}: {e}"))?);
    }
    Ok(out)
}

/// The function type inside `::core::option::Option<..>`.
fn optional_fn(ty: &Type) -> Option<&TypeBareFn> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    let PathArguments::AngleBracketed(args) = &last.arguments else { return None };
    match (last.ident == "Option", args.args.first(), args.args.len()) {
        (true, Some(GenericArgument::Type(Type::BareFn(f))), 1) => Some(f),
        _ => None,
    }
}

/// Whether a function pointer type is `unsafe extern "C" fn`, as [`Signature`] writes it.
fn is_unsafe_extern_c(f: &TypeBareFn) -> bool {
    let abi = f.abi.as_ref().and_then(|a| a.name.as_ref()).map(|n| n.value());
    f.unsafety.is_some() && abi.as_deref() == Some("C")
}

fn signature(params: &[(String, &Type)], output: &ReturnType, erase: &[&str]) -> Result<Signature, String> {
    let mut rendered = Vec::new();
    for (name, ty) in params {
        rendered.push((name.clone(), render(ty, erase).map_err(|e| format!("parameter {name}: {e}"))?));
    }
    let ret = match output {
        ReturnType::Default => String::new(),
        ReturnType::Type(_, ty) => render(ty, erase).map_err(|e| format!("return type: {e}"))?,
    };
    Ok(Signature { params: rendered, ret })
}

/// A type of the kinds bindgen writes for C (paths, raw pointers, C function
/// pointers) on one line, as prettyplease prints it: `*mut ::core::ffi::c_int`.
/// A pointer to a struct named in `erase` becomes a pointer to `c_void`.
pub fn render(ty: &Type, erase: &[&str]) -> Result<String, String> {
    let mut out = String::new();
    render_into(ty, erase, &mut out)?;
    Ok(out)
}

fn render_into(ty: &Type, erase: &[&str], out: &mut String) -> Result<(), String> {
    match ty {
        Type::Path(p) if p.qself.is_none() => {
            if p.path.leading_colon.is_some() {
                out.push_str("::");
            }
            for (i, segment) in p.path.segments.iter().enumerate() {
                if i > 0 {
                    out.push_str("::");
                }
                out.push_str(&segment.ident.to_string());
                render_arguments(&segment.arguments, erase, out)?;
            }
            Ok(())
        }
        Type::Ptr(p) => {
            out.push_str(if p.mutability.is_some() { "*mut " } else { "*const " });
            if erase.iter().any(|s| is_named(&p.elem, s)) {
                out.push_str("::core::ffi::c_void");
                Ok(())
            } else {
                render_into(&p.elem, erase, out)
            }
        }
        Type::BareFn(f) => render_fn(f, erase, out),
        _ => Err("a type the generator does not read (only paths, raw pointers and C function pointers)".into()),
    }
}

/// `<A, B>` after a path segment.
fn render_arguments(args: &PathArguments, erase: &[&str], out: &mut String) -> Result<(), String> {
    match args {
        PathArguments::None => Ok(()),
        PathArguments::AngleBracketed(args) => {
            out.push('<');
            for (i, arg) in args.args.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let GenericArgument::Type(t) = arg else { return Err("a generic argument that is not a type".into()) };
                render_into(t, erase, out)?;
            }
            out.push('>');
            Ok(())
        }
        PathArguments::Parenthesized(_) => Err("parenthesized generic arguments".into()),
    }
}

/// `unsafe extern "C" fn(name: T, ..) -> R`.
fn render_fn(f: &TypeBareFn, erase: &[&str], out: &mut String) -> Result<(), String> {
    if f.variadic.is_some() {
        return Err("a variadic function pointer".into());
    }
    if f.unsafety.is_some() {
        out.push_str("unsafe ");
    }
    if let Some(abi) = &f.abi {
        match &abi.name {
            Some(name) => out.push_str(&format!("extern \"{}\" ", name.value())),
            None => out.push_str("extern "),
        }
    }
    out.push_str("fn(");
    for (i, arg) in f.inputs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        if let Some((name, _)) = &arg.name {
            out.push_str(&format!("{name}: "));
        }
        render_into(&arg.ty, erase, out)?;
    }
    out.push(')');
    if let ReturnType::Type(_, ret) = &f.output {
        out.push_str(" -> ");
        render_into(ret, erase, out)?;
    }
    Ok(())
}

/// Whether `ty` is the plain path `name`.
fn is_named(ty: &Type, name: &str) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.leading_colon.is_none() && p.path.is_ident(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_declarations_and_erases_versioned_structs() {
        let src = r#"
            unsafe extern "C" {
                pub fn cudaDeviceSynchronize() -> cudaError_t;
                pub fn cudaGetDeviceProperties_v2(
                    prop: *mut cudaDeviceProp,
                    device: ::core::ffi::c_int,
                ) -> cudaError_t;
                pub fn cudaMalloc(devPtr: *mut *mut ::core::ffi::c_void, size: usize) -> cudaError_t;
            }
        "#;
        let decls = parse_decls(src, &["cudaDeviceProp"]).unwrap();
        assert_eq!(decls["cudaDeviceSynchronize"].sig.to_string(), "unsafe extern \"C\" fn() -> cudaError_t");
        let props = &decls["cudaGetDeviceProperties"];
        assert_eq!(props.symbol, "cudaGetDeviceProperties_v2");
        assert_eq!(props.sig.params[0], ("prop".into(), "*mut cudaDeviceProp".into()));
        assert_eq!(
            props.table_sig.to_string(),
            "unsafe extern \"C\" fn(prop: *mut ::core::ffi::c_void, device: ::core::ffi::c_int) -> cudaError_t"
        );
        assert_eq!(decls["cudaMalloc"].sig.params[0].1, "*mut *mut ::core::ffi::c_void");
        assert!(decls["cudaMalloc"].sig.same_abi(&decls["cudaMalloc"].table_sig));
    }

    #[test]
    fn reads_optional_function_pointer_typedefs() {
        let src = r#"
            pub type CUresult = cudaError_enum;
            pub type PFN_cuGetErrorName_v6000 = ::core::option::Option<
                unsafe extern "C" fn(
                    error: CUresult,
                    pStr: *mut *const ::core::ffi::c_char,
                ) -> CUresult,
            >;
            pub type PFN_cuInit_v2000 = ::core::option::Option<unsafe extern "C" fn(Flags: ::core::ffi::c_uint) -> CUresult>;
        "#;
        let pfns = parse_pfns(src).unwrap();
        assert_eq!(pfns.len(), 2);
        assert_eq!(
            pfns["PFN_cuGetErrorName_v6000"].to_string(),
            "unsafe extern \"C\" fn(error: CUresult, pStr: *mut *const ::core::ffi::c_char) -> CUresult"
        );
        assert_eq!(
            pfns["PFN_cuInit_v2000"].to_string(),
            "unsafe extern \"C\" fn(Flags: ::core::ffi::c_uint) -> CUresult"
        );
    }

    #[test]
    fn refuses_what_it_cannot_render() {
        assert!(parse_pfns("pub type PFN_x = unsafe extern \"C\" fn();").is_err());
        assert!(parse_decls("unsafe extern \"C\" { pub fn f(x: &u8); }", &[]).is_err());
        assert!(parse_decls("unsafe extern \"C\" { pub fn f(x: i32, ...); }", &[]).is_err());
    }
}
