//! The shape of the allowlists the generator's root declares: what each set of
//! bindings binds, handed to the modules that run bindgen and write the tables.

/// `(name, doc line)` of a runtime function.
pub type RuntimeFn = (&'static str, &'static str);

/// `(versioned symbol, ABI version, doc line)` of a driver function.
pub type DriverFn = (&'static str, u32, &'static str);

/// What the runtime bindings (`cudaNN.rs`, `cudaNN_fns.rs`, `api.rs`) bind.
pub struct RuntimeList {
    /// The functions of the table, in its order.
    pub functions: &'static [RuntimeFn],
    /// Functions only some supported runtimes export: a `PFN_<name>` type each.
    pub optional: &'static [RuntimeFn],
    /// Types bound (recursively).
    pub types: &'static [&'static str],
    /// Macro constants bound (regular expressions).
    pub vars: &'static [&'static str],
    /// C enums, emitted as newtypes.
    pub enums: &'static [&'static str],
    /// Structs whose layout differs between major versions: the table passes
    /// pointers to them untyped.
    pub versioned_structs: &'static [&'static str],
    /// CUDA 12 `_v2` entry points that fall back to the unversioned symbol.
    pub same_abi_fallback_12: &'static [&'static str],
}

/// What the driver bindings (`driver.rs`, `driver_api.rs`) bind.
pub struct DriverList {
    /// The functions of the table, in its order.
    pub functions: &'static [DriverFn],
    /// Types bound (recursively), besides the function pointer types.
    pub types: &'static [&'static str],
    /// Macro constants bound (regular expressions).
    pub vars: &'static [&'static str],
    /// C enums, emitted as newtypes.
    pub enums: &'static [&'static str],
}

impl DriverList {
    /// The `cudaTypedefs.h` type of each function: `PFN_<base>_v<version>`.
    pub fn pfn_names(&self) -> impl Iterator<Item = String> {
        self.functions.iter().map(|(symbol, version, _)| pfn_name(symbol, *version))
    }
}

/// `PFN_<base>_v<version>`, the `cudaTypedefs.h` type of a driver function.
pub fn pfn_name(symbol: &str, version: u32) -> String {
    format!("PFN_{}_v{version}", driver_base(symbol))
}

/// The base name of a versioned driver symbol (`cuCtxCreate_v2` -> `cuCtxCreate`).
pub fn driver_base(symbol: &str) -> &str {
    match symbol.rfind("_v") {
        Some(i) if symbol[i + 2..].chars().all(|c| c.is_ascii_digit()) && i + 2 < symbol.len() => &symbol[..i],
        _ => symbol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_names_drop_only_a_version_suffix() {
        assert_eq!(driver_base("cuCtxCreate_v2"), "cuCtxCreate");
        assert_eq!(driver_base("cuInit"), "cuInit");
        assert_eq!(driver_base("cuFoo_v"), "cuFoo_v");
        assert_eq!(driver_base("cuFoo_vx"), "cuFoo_vx");
        assert_eq!(pfn_name("cuMemHostRegister_v2", 6050), "PFN_cuMemHostRegister_v6050");
    }
}
