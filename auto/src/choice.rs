//! Which backend [`Auto`](crate::Auto) runs on: read from `GPUMEM_BACKEND`, or found by asking
//! the GPU runtimes for a device, once per process.

use std::ffi::OsStr;
use std::sync::OnceLock;

use gpumem_core::{Error, Result};

/// The environment variable that picks the backend.
pub const BACKEND_ENV: &str = "GPUMEM_BACKEND";

/// The forms `GPUMEM_BACKEND` accepts, for its error.
const ACCEPTED: &str = "cuda, hip or host (unset or empty: CUDA where its driver finds a device, else HIP \
                        where its runtime finds one, else the host)";

// The backends this build has, for the error of a backend asked for but not compiled in.
#[cfg(all(feature = "cuda", feature = "hip"))]
const COMPILED_IN: &str = "a backend this program was built with: cuda, hip or host";
#[cfg(all(feature = "cuda", not(feature = "hip")))]
const COMPILED_IN: &str =
    "a backend this program was built with: cuda or host (hip needs gpumem's `hip` feature at build time)";
#[cfg(all(not(feature = "cuda"), feature = "hip"))]
const COMPILED_IN: &str =
    "a backend this program was built with: hip or host (cuda needs gpumem's `cuda` feature at build time)";
#[cfg(not(any(feature = "cuda", feature = "hip")))]
const COMPILED_IN: &str =
    "a backend this program was built with: host (cuda needs gpumem's `cuda` feature and \
                           hip needs gpumem's `hip` feature at build time)";

/// The backend [`Auto`](crate::Auto) chose. Only the backends compiled in have a variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Choice {
    /// The host backend (`gpumem_core::host::Host`).
    Host,
    /// The CUDA backend (`gpumem_cuda::Cuda`).
    #[cfg(feature = "cuda")]
    Cuda,
    /// The HIP backend (`gpumem_hip::Hip`).
    #[cfg(feature = "hip")]
    Hip,
}

impl Choice {
    /// The chosen backend's name: `"host"`, `"cuda"` or `"hip"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Choice::Host => "host",
            #[cfg(feature = "cuda")]
            Choice::Cuda => "cuda",
            #[cfg(feature = "hip")]
            Choice::Hip => "hip",
        }
    }
}

/// A backend named by `GPUMEM_BACKEND`, whether compiled in or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Named {
    Cuda,
    Hip,
    Host,
}

/// Why no backend could be chosen; kept so every call reports the same error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ChoiceError {
    /// `GPUMEM_BACKEND` holds none of the accepted forms.
    Malformed(String),
    /// `GPUMEM_BACKEND` names a backend this build does not have.
    #[cfg_attr(all(feature = "cuda", feature = "hip"), allow(dead_code))]
    NotCompiledIn(&'static str),
}

impl ChoiceError {
    /// The error every call reports.
    pub(crate) fn to_error(&self) -> Error {
        match self {
            ChoiceError::Malformed(value) => {
                Error::InvalidEnvironment { variable: BACKEND_ENV, value: value.clone(), expected: ACCEPTED }
            }
            ChoiceError::NotCompiledIn(name) => Error::InvalidEnvironment {
                variable: BACKEND_ENV,
                value: (*name).to_owned(),
                expected: COMPILED_IN,
            },
        }
    }
}

/// Reads `GPUMEM_BACKEND`'s value: `None` (unset or empty: choose by probing) or the backend
/// named. Surrounding whitespace is ignored; the names are lower case, as in the docs.
pub(crate) fn parse(value: Option<&OsStr>) -> std::result::Result<Option<Named>, ChoiceError> {
    let Some(raw) = value else { return Ok(None) };
    let Some(text) = raw.to_str() else {
        return Err(ChoiceError::Malformed(raw.to_string_lossy().into_owned()));
    };
    match text.trim() {
        "" => Ok(None),
        "cuda" => Ok(Some(Named::Cuda)),
        "hip" => Ok(Some(Named::Hip)),
        "host" => Ok(Some(Named::Host)),
        _ => Err(ChoiceError::Malformed(text.to_owned())),
    }
}

/// The choice for a request: the backend named, if compiled in; else the first of CUDA and HIP
/// (those compiled in) whose probe finds a device; else the host. A probe runs only when needed.
// Without a GPU backend built in, the probes are never run.
#[cfg_attr(not(all(feature = "cuda", feature = "hip")), allow(unused_variables))]
pub(crate) fn pick(
    named: Option<Named>,
    cuda_has_device: impl FnOnce() -> bool,
    hip_has_device: impl FnOnce() -> bool,
) -> std::result::Result<Choice, ChoiceError> {
    match named {
        Some(Named::Host) => Ok(Choice::Host),
        #[cfg(feature = "cuda")]
        Some(Named::Cuda) => Ok(Choice::Cuda),
        #[cfg(not(feature = "cuda"))]
        Some(Named::Cuda) => Err(ChoiceError::NotCompiledIn("cuda")),
        #[cfg(feature = "hip")]
        Some(Named::Hip) => Ok(Choice::Hip),
        #[cfg(not(feature = "hip"))]
        Some(Named::Hip) => Err(ChoiceError::NotCompiledIn("hip")),
        None => {
            #[cfg(feature = "cuda")]
            if cuda_has_device() {
                return Ok(Choice::Cuda);
            }
            #[cfg(feature = "hip")]
            if hip_has_device() {
                return Ok(Choice::Hip);
            }
            Ok(Choice::Host)
        }
    }
}

/// Whether CUDA's driver loads and finds a device (any failure, `DriverNotFound` included, is
/// "no").
#[cfg(feature = "cuda")]
fn cuda_has_device() -> bool {
    use gpumem_core::DeviceOps;
    gpumem_cuda::Cuda::device_count().is_ok_and(|n| n > 0)
}

/// Whether HIP's runtime loads and finds a device.
#[cfg(feature = "hip")]
fn hip_has_device() -> bool {
    use gpumem_core::DeviceOps;
    gpumem_hip::Hip::device_count().is_ok_and(|n| n > 0)
}

/// The choice, made on first use and kept for the process.
static CHOICE: OnceLock<std::result::Result<Choice, ChoiceError>> = OnceLock::new();

/// Makes the choice: `GPUMEM_BACKEND`, or the probes.
#[cold]
fn choose() -> std::result::Result<Choice, ChoiceError> {
    let named = parse(std::env::var_os(BACKEND_ENV).as_deref())?;
    #[cfg(feature = "cuda")]
    let cuda = cuda_has_device;
    #[cfg(not(feature = "cuda"))]
    let cuda = || false;
    #[cfg(feature = "hip")]
    let hip = hip_has_device;
    #[cfg(not(feature = "hip"))]
    let hip = || false;
    pick(named, cuda, hip)
}

/// The backend [`Auto`](crate::Auto) runs on. The first call chooses it (reading
/// `GPUMEM_BACKEND`, or asking the CUDA driver and then the HIP runtime for a device), once per
/// process; every later call, and every operation of `Auto`, gives the same answer.
///
/// # Errors
///
/// `Error::InvalidEnvironment` when `GPUMEM_BACKEND` is none of `cuda`, `hip`, `host` (or
/// empty), or names a backend this program was built without; the error names the variable, its
/// value and the accepted forms.
#[inline]
pub fn chosen() -> Result<Choice> {
    match CHOICE.get_or_init(choose) {
        Ok(choice) => Ok(*choice),
        Err(e) => Err(e.to_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_reads_three_names_and_nothing_else() {
        assert_eq!(parse(None), Ok(None));
        assert_eq!(parse(Some(OsStr::new(""))), Ok(None));
        assert_eq!(parse(Some(OsStr::new("  "))), Ok(None));
        assert_eq!(parse(Some(OsStr::new("cuda"))), Ok(Some(Named::Cuda)));
        assert_eq!(parse(Some(OsStr::new(" hip\n"))), Ok(Some(Named::Hip)));
        assert_eq!(parse(Some(OsStr::new("host"))), Ok(Some(Named::Host)));
        for bad in ["CUDA", "rocm", "cpu", "cuda,hip", "1"] {
            assert_eq!(parse(Some(OsStr::new(bad))), Err(ChoiceError::Malformed(bad.into())), "{bad}");
        }
    }

    #[test]
    fn a_malformed_value_names_variable_value_and_forms() {
        let e = parse(Some(OsStr::new("rocm"))).unwrap_err().to_error();
        match &e {
            Error::InvalidEnvironment { variable, value, expected } => {
                assert_eq!((*variable, value.as_str()), ("GPUMEM_BACKEND", "rocm"));
                assert!(expected.starts_with("cuda, hip or host"), "{expected}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(e.to_string().starts_with("GPUMEM_BACKEND=\"rocm\" is not valid: cuda, hip or host"), "{e}");
    }

    #[test]
    fn probing_prefers_cuda_then_hip_then_the_host() {
        let never = || -> bool { panic!("probed a backend after the choice was made") };
        assert_eq!(pick(Some(Named::Host), never, never), Ok(Choice::Host));
        assert_eq!(pick(None, || false, || false), Ok(Choice::Host));
        #[cfg(feature = "cuda")]
        {
            assert_eq!(pick(None, || true, never), Ok(Choice::Cuda));
            assert_eq!(pick(Some(Named::Cuda), never, never), Ok(Choice::Cuda));
        }
        #[cfg(feature = "hip")]
        {
            assert_eq!(pick(None, || false, || true), Ok(Choice::Hip));
            assert_eq!(pick(Some(Named::Hip), never, never), Ok(Choice::Hip));
        }
        // Without the backend compiled in, a device it would find cannot be chosen.
        #[cfg(not(feature = "cuda"))]
        assert_eq!(pick(None, || true, || false), Ok(Choice::Host));
        #[cfg(not(feature = "hip"))]
        assert_eq!(pick(None, || false, || true), Ok(Choice::Host));
    }

    #[test]
    fn a_backend_not_compiled_in_is_a_clear_error() {
        let never = || -> bool { panic!("probed") };
        for (named, name, compiled) in
            [(Named::Cuda, "cuda", cfg!(feature = "cuda")), (Named::Hip, "hip", cfg!(feature = "hip"))]
        {
            let r = pick(Some(named), never, never);
            if compiled {
                assert_eq!(r.map(Choice::name), Ok(name));
                continue;
            }
            assert_eq!(r, Err(ChoiceError::NotCompiledIn(name)));
            let e = r.unwrap_err().to_error();
            assert!(
                matches!(&e, Error::InvalidEnvironment { variable: "GPUMEM_BACKEND", value, .. } if value == name)
            );
            let text = e.to_string();
            assert!(
                text.contains("built with") && text.contains(&format!("{name} needs gpumem's")),
                "{text}"
            );
        }
    }
}
