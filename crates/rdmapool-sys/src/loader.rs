//! Opening the shared libraries and resolving versioned symbols into typed function pointers.

use std::ffi::{c_void, CStr, CString};
use std::fmt;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// Why [`verbs()`](crate::verbs) or [`rdmacm()`](crate::rdmacm) could not provide its table.
///
/// The `Display` text names what is missing and what to install, e.g.
/// `libibverbs.so.1 not found: install rdma-core's ibverbs-providers/libibverbs1 package ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// `dlopen` failed: the library is not installed (or not on the loader's search path, or one
    /// of its own dependencies is missing; `detail` has the loader's message).
    LibraryNotFound {
        /// The name passed to `dlopen`, e.g. `libibverbs.so.1`.
        library: String,
        /// What to install, e.g. `ibverbs-providers/libibverbs1`.
        package: &'static str,
        /// The package-manager command lines that install it.
        install: &'static str,
        /// `dlerror()`'s message.
        detail: String,
    },
    /// The library was opened but does not export a function at the version this crate binds:
    /// the installed rdma-core is older than the one that introduced it (or is not rdma-core).
    SymbolNotFound {
        /// The library that lacks the symbol.
        library: String,
        /// The function's name, e.g. `ibv_reg_mr_iova2`.
        symbol: &'static str,
        /// The symbol version looked up, e.g. `IBVERBS_1.8`.
        version: &'static str,
        /// What to upgrade.
        package: &'static str,
        /// `dlerror()`'s message.
        detail: String,
    },
}

impl LoadError {
    /// True if the library itself is absent (as opposed to present but too old).
    pub fn is_library_missing(&self) -> bool {
        matches!(self, LoadError::LibraryNotFound { .. })
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::LibraryNotFound {
                library,
                package,
                install,
                detail,
            } => write!(
                f,
                "{library} not found: install rdma-core's {package} package ({install}) \
                 (dlopen: {detail})"
            ),
            LoadError::SymbolNotFound {
                library,
                symbol,
                version,
                package,
                detail,
            } => write!(
                f,
                "{library} has no {symbol}@{version}: the installed rdma-core is too old \
                 (or not rdma-core); upgrade its {package} package (dlsym: {detail})"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// One function a table resolves: its name and the ELF symbol version it is pinned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol {
    /// The C function name, e.g. `ibv_reg_mr`.
    pub name: &'static str,
    /// The symbol version, e.g. `IBVERBS_1.1` (the default, `@@`, version in rdma-core 44).
    pub version: &'static str,
}

/// What a loader needs to know about one library, for opening it and for its error messages.
pub(crate) struct LibSpec {
    pub(crate) package: &'static str,
    pub(crate) install: &'static str,
}

/// An open library and its raw `dlopen` handle (for `dlvsym`, which libloading lacks).
pub(crate) struct Opened {
    /// Owns the handle: dropping it `dlclose`s the library. (On glibc, lookups use `handle`.)
    #[cfg_attr(all(target_os = "linux", target_env = "gnu"), allow(dead_code))]
    lib: Library,
    pub(crate) name: String,
    handle: *mut c_void,
    spec: &'static LibSpec,
}

/// `dlopen(path, RTLD_NOW | RTLD_LOCAL)`.
///
/// `RTLD_NOW` so a library with unresolvable dependencies fails here, not at a later call;
/// `RTLD_LOCAL` so its symbols do not leak into the global namespace (libibverbs' providers
/// and librdmacm find libibverbs through their own `DT_NEEDED` entries, not the global scope).
///
/// # Safety
///
/// Opening a library runs its ELF initialisers. The caller must name a library whose
/// initialisers are sound to run in this process (rdma-core's only set up their own state).
pub(crate) unsafe fn open(path: &str, spec: &'static LibSpec) -> Result<Opened, LoadError> {
    // SAFETY: the caller vouches for the library's initialisers (see the function's contract).
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| {
        LoadError::LibraryNotFound {
            library: path.to_owned(),
            package: spec.package,
            install: spec.install,
            detail: e.to_string(),
        }
    })?;
    let handle = lib.into_raw();
    // SAFETY: `handle` was returned by `into_raw` just above and is given back exactly once.
    let lib = unsafe { Library::from_raw(handle) };
    Ok(Opened {
        lib,
        name: path.to_owned(),
        handle,
        spec,
    })
}

impl Opened {
    /// Resolves `symbol@version` to a value of type `F` (a function-pointer type).
    ///
    /// On glibc this is `dlvsym`, so the pinned version is what is bound even if rdma-core
    /// later adds a newer default version with another ABI (libibverbs still exports the
    /// IBVERBS_1.0 variants of many functions, which take pre-1.1 struct layouts). Elsewhere
    /// it is `dlsym`, which returns the default version.
    ///
    /// # Safety
    ///
    /// `F` must be a function-pointer type matching the C prototype of `symbol@version`.
    pub(crate) unsafe fn resolve<F: Copy>(
        &self,
        symbol: &'static str,
        version: &'static str,
    ) -> Result<F, LoadError> {
        assert_eq!(
            std::mem::size_of::<F>(),
            std::mem::size_of::<*mut c_void>(),
            "resolve() produces function pointers only"
        );
        let not_found = |detail: String| LoadError::SymbolNotFound {
            library: self.name.clone(),
            symbol,
            version,
            package: self.spec.package,
            detail,
        };
        let name = CString::new(symbol).expect("symbol names have no NUL");
        let ptr = self.lookup(&name, version).map_err(not_found)?;
        // SAFETY: `ptr` is the non-null address of `symbol@version` in a library that stays
        // loaded as long as `self.lib` does; `F` is a function-pointer type (size checked above)
        // with that function's prototype (the caller's contract).
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&ptr) })
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn lookup(&self, name: &CStr, version: &str) -> Result<*mut c_void, String> {
        let version = CString::new(version).expect("versions have no NUL");
        // SAFETY: dlerror() only reads and clears this thread's error state; clearing it first
        // means a message read below belongs to the dlvsym call.
        unsafe { libc::dlerror() };
        // SAFETY: `self.handle` is a live handle (owned by `self.lib`), and both strings are
        // NUL-terminated and outlive the call.
        let ptr = unsafe { libc::dlvsym(self.handle, name.as_ptr(), version.as_ptr()) };
        if ptr.is_null() {
            // SAFETY: as above; a non-null result is a NUL-terminated string owned by libdl,
            // valid until the next dl* call on this thread, and copied out at once.
            let err = unsafe { libc::dlerror() };
            let detail = if err.is_null() {
                "symbol resolved to NULL".to_owned()
            } else {
                // SAFETY: see the previous comment.
                unsafe { CStr::from_ptr(err) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(detail);
        }
        Ok(ptr)
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    fn lookup(&self, name: &CStr, _version: &str) -> Result<*mut c_void, String> {
        // SAFETY: the symbol is read as a raw address, which is valid for any symbol; the
        // caller of `resolve` gives it its function type.
        let sym = unsafe { self.lib.get::<*mut c_void>(name.to_bytes_with_nul()) }
            .map_err(|e| e.to_string())?;
        let ptr = sym.into_raw();
        if ptr.is_null() {
            return Err("symbol resolved to NULL".to_owned());
        }
        Ok(ptr)
    }

    /// Looks a symbol up by name only (`dlsym`: the default version), for tests that check the
    /// pinned versions are the defaults of the installed library.
    pub(crate) fn default_address(&self, symbol: &str) -> Option<*mut c_void> {
        let name = CString::new(symbol).ok()?;
        // SAFETY: as in `lookup`: a live handle and a NUL-terminated name; the address is only
        // compared, never called.
        let ptr = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        (!ptr.is_null()).then_some(ptr)
    }
}

// SAFETY: `handle` is only a copy of the handle `lib` owns; dlsym/dlvsym on it are thread-safe
// and nothing mutates it, so sharing or sending `Opened` is as safe as sharing `Library`.
unsafe impl Send for Opened {}
// SAFETY: see the `Send` impl.
unsafe impl Sync for Opened {}

/// Declares a table of resolved functions: a struct with one `unsafe extern "C" fn` field per
/// function, a constructor that resolves them all (failing on the first missing one), the
/// list of [`Symbol`]s, and a compile-time check that every field's type is exactly the
/// bindgen prototype of that function in `decls.rs`.
macro_rules! fn_table {
    (
        $(#[$meta:meta])*
        pub struct $table:ident {
            $(
                $(#[$fmeta:meta])*
                $version:literal fn $f:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? ;
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $table {
            $(
                $(#[$fmeta])*
                #[doc = ""]
                #[doc = concat!("Resolved as `", stringify!($f), "@", $version, "`.")]
                pub $f: unsafe extern "C" fn($($arg: $ty),*) $(-> $ret)?,
            )*
            opened: $crate::loader::Opened,
        }

        impl $table {
            /// Every function in the table, with the symbol version it is resolved at.
            pub const SYMBOLS: &'static [$crate::loader::Symbol] = &[
                $($crate::loader::Symbol { name: stringify!($f), version: $version },)*
            ];

            fn from_opened(opened: $crate::loader::Opened) -> Result<Self, $crate::loader::LoadError> {
                Ok(Self {
                    $(
                        // SAFETY: the field type is the C prototype of this symbol (checked
                        // against bindgen's declaration by `check_signatures` below).
                        $f: unsafe { opened.resolve(stringify!($f), $version)? },
                    )*
                    opened,
                })
            }

            /// The name the library was opened by.
            pub fn library_name(&self) -> &str {
                &self.opened.name
            }

            /// The address `dlsym` (default symbol version) gives for `symbol`, if any. For
            /// checking that the pinned versions in [`Self::SYMBOLS`] are the defaults.
            pub fn default_symbol_address(&self, symbol: &str) -> Option<*mut ::std::ffi::c_void> {
                self.opened.default_address(symbol)
            }

            /// The address the table holds for `symbol` (the pinned version), if it has one.
            pub fn resolved_address(&self, symbol: &str) -> Option<*mut ::std::ffi::c_void> {
                $(
                    if symbol == stringify!($f) {
                        return Some(self.$f as *mut ::std::ffi::c_void);
                    }
                )*
                None
            }
        }

        impl ::std::fmt::Debug for $table {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($table))
                    .field("library", &self.opened.name)
                    .field("functions", &Self::SYMBOLS.len())
                    .finish_non_exhaustive()
            }
        }

        /// Compile-time check: each field's type must be exactly bindgen's prototype for the
        /// symbol. Generic and never instantiated, so it is type-checked but never compiled to
        /// code and emits no reference to the (unlinked) symbols.
        #[allow(dead_code, clippy::extra_unused_type_parameters)]
        fn check_signatures<NeverInstantiated>() {
            $(
                let _: unsafe extern "C" fn($($ty),*) $(-> $ret)? = $crate::decls::$f;
            )*
        }
    };
}
pub(crate) use fn_table;
